"""COCO mAP and mAR of a whole validation set from one evaluation, by a chosen backend package.

`OnePassCocoMeanAveragePrecision` takes torchmetrics MeanAveragePrecision's arguments, inputs
and output keys, and evaluates every class in the one COCOeval pass it needs for the aggregate
numbers; keypoints are scored by OKS as COCOeval's "keypoints" type does. All backends return the same numbers bit for bit, and those are pycocotools' own (to
~1e-16 in float64, see `_LONE_TRUE_POSITIVE`, then rounded to torchmetrics' float32): boxes
become xywh in float64, detections keep their order (it breaks score ties), ids are 1-based,
and the summary is COCOeval.summarize's arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

from detrkit.config import CocoEvalBackend
from detrkit.training.coco_backends.base import (
    COCO_IOU_THRESHOLDS,
    COCO_RECALL_THRESHOLDS,
    IOU_TYPES,
    KEYPOINT_AREA_NAMES,
    KEYPOINT_AREA_RANGES,
    KEYPOINT_MAX_DETS,
    Accumulation,
    CocoBackend,
    CocoInputs,
    EvalGrid,
    IouType,
    without_matches,
)
from detrkit.training.coco_backends.faster_coco_eval import FasterCocoEvalBackend
from detrkit.training.coco_backends.hotcoco import HotcocoBackend
from detrkit.training.coco_backends.keypoints import check_sigmas, oks_sigmas
from detrkit.training.coco_backends.rle import EncodedMasks, encode_masks, mask_areas, split_runs
from detrkit.training.coco_backends.summary import per_class, summarize
from detrkit.training.coco_backends.ufcoco import UfcocoBackend
from detrkit.training.coco_backends.vernier import VernierBackend

# the one place a backend name is resolved; its keys are exactly CocoEvalBackend's values
_BACKENDS: dict[str, type[CocoBackend]] = {
    "vernier": VernierBackend,
    "hotcoco": HotcocoBackend,
    "ufcoco": UfcocoBackend,
    "faster_coco_eval": FasterCocoEvalBackend,
}

BoxFormat = Literal["xyxy", "xywh", "cxcywh"]
# state name -> (the IoU types that need it; dtype); every state holds one entry per image
_STATES: dict[str, tuple[tuple[IouType, ...], torch.dtype]] = {
    "det_labels": (IOU_TYPES, torch.int64),
    "det_counts": (IOU_TYPES, torch.int64),
    "det_scores": (IOU_TYPES, torch.float64),
    "gt_labels": (IOU_TYPES, torch.int64),
    "gt_counts": (IOU_TYPES, torch.int64),
    "gt_crowd": (IOU_TYPES, torch.bool),
    "gt_area": (IOU_TYPES, torch.float64),
    "det_boxes": (("bbox",), torch.float64),
    "gt_boxes": (("bbox", "keypoints"), torch.float64),  # OKS of ground truth without keypoints uses its box
    "det_runs": (("segm",), torch.int64),  # masks, run-length encoded
    "det_run_lengths": (("segm",), torch.int64),
    "gt_runs": (("segm",), torch.int64),
    "gt_run_lengths": (("segm",), torch.int64),
    "mask_sizes": (("segm",), torch.int64),  # (1, 2) height, width per image
    "det_keypoints": (("keypoints",), torch.float64),  # (N, K, 3) x, y in pixels, and a score
    "gt_keypoints": (("keypoints",), torch.float64),  # (N, K, 3) x, y in pixels, and visibility 0..2
}
# pycocotools' precision tp / (tp + fp + np.spacing(1)) is 1 - 2.2e-16 for a lone true positive
# (exactly 1 from two on), faster-coco-eval's is 1; the arrays cannot say which 1.0s were lone
# ones, so every backend reports exactly 1: a shift of at most ~1e-16 from pycocotools
_LONE_TRUE_POSITIVE = 1.0 / (1.0 + np.spacing(1.0))


class OnePassCocoMeanAveragePrecision(Metric):
    """torchmetrics' MeanAveragePrecision, evaluated by `backend` in a single COCOeval pass.

    `update(preds, targets)` takes per-image dicts: preds `boxes` (in `box_format`, pixels),
    `scores`, integer `labels` and, for segm, `masks` (N, H, W) bool or EncodedMasks; targets `boxes`, `labels`,
    optional `iscrowd` and `area`, and `masks`. A ground truth's size range comes from its
    `area` where that is > 0, else from its mask in both passes when masks are evaluated (as
    torchmetrics does, and pycocotools with a COCO file whose `area` is the mask's), else from
    its box. Box-only updates never synchronise with the device; masks are run-length encoded
    on arrival. `compute()` returns float32 tensors under torchmetrics' keys (prefixed `bbox_`,
    `segm_` or `keypoints_` when several IoU types are evaluated) and `classes` as int32.

    iou_type "keypoints" adds `keypoints` (N, K, 3) to both sides, x, y in pixels and a score
    (preds, unused) or visibility 0..2 (targets); targets keep their `boxes`, preds need none.
    They are scored by OKS with `oks_sigmas` (default: COCO person's for K = 17, else 0.05 each)
    at COCO's keypoint grid: 20 detections per image, areas all/medium/large; their keys are
    map, map_50, map_75, map_medium, map_large, mar_20, mar_50, mar_75, mar_medium, mar_large.

    Unlike torchmetrics, which knows only the labels it has seen, `num_classes` makes `classes`
    0 .. num_classes - 1 and the per-class results one entry each, -1 where a class has no
    ground truth (as torchmetrics reports a class seen only in predictions); the aggregate
    numbers do not change, and a label outside that range is an error at compute(). Only
    macro averaging, no extended summary and no torchmetrics synchronisation are supported;
    asking for them raises ValueError.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        box_format: BoxFormat = "xyxy",
        iou_type: IouType | Sequence[IouType] = "bbox",
        iou_thresholds: Sequence[float] | None = None,
        rec_thresholds: Sequence[float] | None = None,
        max_detection_thresholds: Sequence[int] | None = None,
        class_metrics: bool = False,
        extended_summary: bool = False,
        average: Literal["macro", "micro"] = "macro",
        backend: CocoEvalBackend = "vernier",
        num_classes: int | None = None,
        oks_sigmas: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> None:
        _refuse_unsupported(extended_summary, average, kwargs)
        super().__init__(**kwargs, sync_on_compute=False)
        self.iou_types: tuple[IouType, ...] = _iou_types(iou_type)
        self.oks_sigmas = check_sigmas(oks_sigmas)
        self._keypoint_count: int | None = None if self.oks_sigmas is None else len(self.oks_sigmas)
        if box_format not in get_args(BoxFormat):
            raise ValueError(f"box_format must be one of {get_args(BoxFormat)}, got {box_format!r}")
        if num_classes is not None and (not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool)
                                        or num_classes < 1):
            raise ValueError(f"num_classes must be a positive int or None, got {num_classes!r}")
        self.box_format = box_format
        self.class_metrics = class_metrics
        self.average = average
        self.num_classes = None if num_classes is None else int(num_classes)
        self.backend = backend
        self.grid = EvalGrid(
            iou_thresholds=_thresholds(iou_thresholds, COCO_IOU_THRESHOLDS, "iou_thresholds"),
            recall_thresholds=_thresholds(rec_thresholds, COCO_RECALL_THRESHOLDS, "rec_thresholds"),
            max_dets=_max_dets(max_detection_thresholds),
        )
        self.keypoint_grid = EvalGrid(self.grid.iou_thresholds, self.grid.recall_thresholds, KEYPOINT_MAX_DETS,
                                      KEYPOINT_AREA_RANGES, KEYPOINT_AREA_NAMES)
        _check_backend(backend, self.iou_types)
        self._coco_backend = _BACKENDS[backend]()
        self._add_states()

    def _add_states(self) -> None:
        """One list per column, one entry per image; `*_counts` say how many rows each image has."""
        for name, (iou_types, _) in _STATES.items():
            if set(iou_types) & set(self.iou_types):
                self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: Sequence[dict[str, Tensor]], targets: Sequence[dict[str, Tensor]]) -> None:
        """Store one batch of images; shapes are checked, values are not read."""
        if len(preds) != len(targets):
            raise ValueError(f"got {len(preds)} predictions for {len(targets)} targets")
        for index, (pred, target) in enumerate(zip(preds, targets)):
            self._check(pred, ("scores", "labels"), f"preds[{index}]", "det_boxes" in self._defaults)
            self._check(target, ("labels",) + tuple(key for key in ("iscrowd", "area") if key in target),
                        f"targets[{index}]", "gt_boxes" in self._defaults)
            if "segm" in self.iou_types and pred["masks"].shape[-2:] != target["masks"].shape[-2:]:
                raise ValueError(f"image {index}: prediction masks are {tuple(pred['masks'].shape[-2:])}, target "
                                 f"masks {tuple(target['masks'].shape[-2:])}; resize them to one size")
            if "keypoints" in self.iou_types:
                self._check_keypoints(pred, target, index)
        for pred, target in zip(preds, targets):
            labels = target["labels"]
            count = self._store(pred, "det")
            self.det_scores.append(pred["scores"].detach().reshape(count).to(torch.float64))  # exact
            count = self._store(target, "gt")
            self.gt_crowd.append(target.get("iscrowd", torch.zeros_like(labels)).detach().reshape(count) != 0)
            area = target.get("area", torch.zeros(count, device=labels.device)).detach().reshape(count)
            self.gt_area.append(area.to(torch.float64))
            if "segm" in self.iou_types:
                self.mask_sizes.append(torch.tensor([list(pred["masks"].shape[-2:])], device=labels.device))
            if "keypoints" in self.iou_types:
                self.det_keypoints.append(pred["keypoints"].detach().to(torch.float64))  # exact
                self.gt_keypoints.append(target["keypoints"].detach().to(torch.float64))

    def _check_keypoints(self, pred: dict[str, Tensor], target: dict[str, Tensor], index: int) -> None:
        """(N, K, 3) keypoints on both sides, with one K for every image (and the sigmas)."""
        for where, item in ((f"preds[{index}]", pred), (f"targets[{index}]", target)):
            if "keypoints" not in item:
                raise ValueError(f"{where} lacks ['keypoints']")
            shape = tuple(item["keypoints"].shape)
            if len(shape) != 3 or shape[0] != item["labels"].numel() or shape[2] != 3:
                raise ValueError(f"{where}: {item['labels'].numel()} labels but keypoints of shape {shape}; "
                                 "expected (N, K, 3)")
            if self._keypoint_count is not None and shape[1] != self._keypoint_count:
                source = "OKS sigmas" if self.oks_sigmas is not None else "keypoints per instance before"
                raise ValueError(f"{where}: {shape[1]} keypoints per instance, but {self._keypoint_count} {source}")
            self._keypoint_count = shape[1]

    def _check(self, item: dict[str, Tensor], columns: tuple[str, ...], where: str, boxed: bool) -> None:
        """Every column one row per label: (N,) columns, (N, 4) boxes where `boxed`, (N, H, W) masks."""
        required = columns + (("boxes",) if boxed else ()) + (("masks",) if "segm" in self.iou_types else ())
        missing = [key for key in required if key not in item]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        labels = item["labels"].dtype
        if labels.is_floating_point or labels.is_complex or labels == torch.bool:
            raise ValueError(f"{where}['labels'] must hold integer class ids, got dtype {labels}")
        count = item["labels"].numel()
        for key in columns:
            if item[key].numel() != count:
                raise ValueError(f"{where}: {count} labels but {key} of shape {tuple(item[key].shape)}")
        if boxed and item["boxes"].numel() != 4 * count:
            raise ValueError(f"{where}: {count} labels but boxes of shape {tuple(item['boxes'].shape)}")
        if "segm" in self.iou_types and (item["masks"].ndim != 3 or len(item["masks"]) != count):
            raise ValueError(f"{where}: {count} labels but masks of shape {tuple(item['masks'].shape)}")

    def _store(self, item: dict[str, Tensor], side: str) -> int:
        """Append one checked image's labels, boxes and masks to `side`'s states; returns its count."""
        labels = item["labels"].detach()
        count = labels.numel()
        getattr(self, f"{side}_labels").append(labels.reshape(count).to(torch.int64))
        getattr(self, f"{side}_counts").append(torch.full((1,), count, dtype=torch.int64, device=labels.device))
        if f"{side}_boxes" in self._defaults:
            boxes = item["boxes"].detach().reshape(count, 4)
            getattr(self, f"{side}_boxes").append(boxes.to(torch.float64))  # exact
        if "segm" in self.iou_types:
            masks = item["masks"]  # dense (N, H, W), or already EncodedMasks
            runs, lengths = (masks.runs, masks.lengths) if isinstance(masks, EncodedMasks) else encode_masks(masks.detach())
            getattr(self, f"{side}_runs").append(runs)
            getattr(self, f"{side}_run_lengths").append(lengths)
        return count

    def compute(self) -> dict[str, Tensor]:
        """torchmetrics' MeanAveragePrecision keys as float32 tensors, and `classes` as int32."""
        state = {name: _numpy(getattr(self, name), _STATES[name][1]) for name in self._defaults}
        classes = self._classes(state)
        results: dict[str, Tensor] = {}
        for iou_type in self.iou_types:
            prefix = f"{iou_type}_" if len(self.iou_types) > 1 else ""
            grid = self.keypoint_grid if iou_type == "keypoints" else self.grid
            accumulation = self._accumulate(self._inputs(state, iou_type, classes), grid)
            summary = summarize(accumulation, grid, iou_type)
            if self.class_metrics:
                summary |= per_class(accumulation, grid)
            else:
                summary |= {"map_per_class": -1.0, f"mar_{grid.max_dets[-1]}_per_class": -1.0}
            # rounded from float64 once, so every backend still returns the same float32 bits
            results |= {prefix + key: torch.tensor(value, dtype=torch.float64).float()
                        for key, value in summary.items()}
        results["classes"] = torch.from_numpy(classes.astype(np.int32))
        return results

    def _classes(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """The evaluated category ids: 0 .. num_classes - 1 if given, else every observed label."""
        observed = np.unique(np.concatenate([state["det_labels"], state["gt_labels"]]).astype(np.int64))
        if self.num_classes is None:
            return observed
        outside = observed[(observed < 0) | (observed >= self.num_classes)]
        if outside.size:
            raise ValueError(f"labels {outside.tolist()} lie outside 0 .. {self.num_classes - 1} "
                             f"(num_classes={self.num_classes})")
        return np.arange(self.num_classes, dtype=np.int64)

    def _accumulate(self, inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
        if len(inputs.dt_scores) == 0 or len(inputs.gt_areas) == 0:
            return without_matches(inputs, grid)
        accumulation = self._coco_backend.accumulate(inputs, grid)
        precision = np.where(accumulation.precision == _LONE_TRUE_POSITIVE, 1.0, accumulation.precision)
        return Accumulation(precision, accumulation.recall)

    def _inputs(self, state: dict[str, np.ndarray], iou_type: IouType, classes: np.ndarray) -> CocoInputs:
        """The stored images as COCO sees them for one IoU type."""
        images = np.arange(1, len(state["det_counts"]) + 1, dtype=np.int64)
        sizes = state["mask_sizes"].reshape(-1, 2) if "segm" in self.iou_types else np.zeros((len(images), 2))
        gt_boxes = self._xywh(state.get("gt_boxes"), len(state["gt_labels"]))
        gt_runs = dt_runs = None
        if iou_type == "segm":
            gt_runs = split_runs(state["gt_runs"], state["gt_run_lengths"])
            dt_runs = split_runs(state["det_runs"], state["det_run_lengths"])
        # with masks, the box pass too buckets ground truth by mask area: a COCO file's `area`
        given = state["gt_area"].astype(np.float64)
        if "segm" in self.iou_types:
            fallback = mask_areas(state["gt_runs"], state["gt_run_lengths"])
        else:
            fallback = gt_boxes[:, 2] * gt_boxes[:, 3]
        return CocoInputs(
            iou_type=iou_type,
            image_ids=images,
            image_sizes=sizes.astype(np.int64),
            category_ids=classes,
            gt_image_ids=np.repeat(images, state["gt_counts"]),
            gt_category_ids=state["gt_labels"].astype(np.int64),
            gt_boxes=gt_boxes,
            gt_areas=np.where(given > 0, given, fallback),
            gt_crowd=(state["gt_crowd"] != 0).astype(np.int64),
            dt_image_ids=np.repeat(images, state["det_counts"]),
            dt_category_ids=state["det_labels"].astype(np.int64),
            dt_boxes=self._xywh(state.get("det_boxes"), len(state["det_labels"])),
            dt_scores=state["det_scores"].astype(np.float64),
            gt_rles=gt_runs,
            dt_rles=dt_runs,
            **(self._keypoint_inputs(state) if iou_type == "keypoints" else {}),
        )

    def _keypoint_inputs(self, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """(G, K, 3) and (D, K, 3) keypoints and the (K,) sigmas to score them with."""
        count = state["gt_keypoints"].shape[1] if state["gt_keypoints"].ndim == 3 else self._keypoint_count or 0
        return {"gt_keypoints": state["gt_keypoints"].reshape(len(state["gt_labels"]), count, 3),
                "dt_keypoints": state["det_keypoints"].reshape(len(state["det_labels"]), count, 3),
                "keypoint_sigmas": oks_sigmas(count, self.oks_sigmas)}

    def _xywh(self, boxes: np.ndarray | None, count: int) -> np.ndarray:
        """(N, 4) float64 xywh; zeros when only masks were stored."""
        if boxes is None:
            return np.zeros((count, 4), dtype=np.float64)
        boxes = boxes.reshape(-1, 4)
        if self.box_format == "xyxy":
            boxes = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
        elif self.box_format == "cxcywh":
            boxes = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, 2:]], axis=1)
        return np.ascontiguousarray(boxes)


def _refuse_unsupported(extended_summary: bool, average: str, kwargs: dict[str, Any]) -> None:
    """MeanAveragePrecision options this metric cannot honour are errors, not ignored; takes
    `sync_on_compute` out of `kwargs` (it must be False: callers gather the states themselves)."""
    if extended_summary:
        raise ValueError("extended_summary=True is not supported by OnePassCocoMeanAveragePrecision")
    if average != "macro":
        raise ValueError(f"OnePassCocoMeanAveragePrecision averages per class only (average='macro'), got {average!r}")
    for option in ("sync_on_compute", "dist_sync_on_step"):
        if kwargs.pop(option, False) is not False:
            raise ValueError(f"OnePassCocoMeanAveragePrecision requires {option}=False: gather the states across "
                             "processes before compute() (as training.evaluation does), not through torchmetrics")


def _iou_types(iou_type: IouType | Sequence[IouType]) -> tuple[IouType, ...]:
    types = (iou_type,) if isinstance(iou_type, str) else tuple(iou_type)
    if not types or any(kind not in IOU_TYPES for kind in types) or len(set(types)) != len(types):
        raise ValueError(f"iou_type must be one or several distinct of {IOU_TYPES}, got {iou_type!r}")
    if "segm" in types and "keypoints" in types:
        raise ValueError("masks and keypoints are not evaluated together: use ('bbox', 'segm') or ('bbox', 'keypoints')")
    return types


def _check_backend(backend: str, iou_types: tuple[IouType, ...]) -> None:
    """A known backend that evaluates every requested IoU type (in the combination asked)."""
    if backend not in _BACKENDS:
        raise ValueError(f"unknown COCO evaluation backend {backend!r}; choose one of {sorted(_BACKENDS)}")
    chosen = _BACKENDS[backend]
    for iou_type in iou_types:
        if iou_type not in chosen.iou_types:
            able = sorted(name for name, other in _BACKENDS.items() if iou_type in other.iou_types)
            raise ValueError(f"COCO evaluation backend {backend!r} cannot evaluate iou_type {iou_type!r}; "
                             f"backends that can: {able}")
    if chosen.requires_bbox and "segm" in iou_types and "bbox" not in iou_types:
        raise ValueError(f"backend {backend!r} evaluates masks only alongside boxes: use iou_type ('bbox', 'segm')")


def _thresholds(values: Sequence[float] | None, default: tuple[float, ...], name: str) -> tuple[float, ...]:
    if values is None:
        return default
    values = tuple(float(value) for value in values)
    if not values or any(not 0.0 <= value <= 1.0 for value in values) or list(values) != sorted(values):
        raise ValueError(f"{name} must be an ascending, non-empty list of values in [0, 1], got {values}")
    return values


def _max_dets(values: Sequence[int] | None) -> tuple[int, ...]:
    if values is None:
        return (1, 10, 100)
    values = tuple(sorted(int(value) for value in values))
    if len(values) != 3 or len(set(values)) != 3 or values[0] < 1:
        raise ValueError(f"max_detection_thresholds must be 3 distinct positive ints, got {values}")
    return values


def _numpy(state: list[Tensor] | Tensor, dtype: torch.dtype) -> np.ndarray:
    """A list state (or its synced concatenation, where an empty rank may add float32) as one array."""
    if isinstance(state, Tensor):
        return state.cpu().to(dtype).numpy()
    if not state:
        return np.zeros(0, dtype=torch.empty(0, dtype=dtype).numpy().dtype)
    return torch.cat([item.cpu() for item in state]).to(dtype).numpy()
