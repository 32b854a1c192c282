"""COCO mAP and mAR of a whole validation set from one evaluation, by a chosen backend package.

`OnePassCocoMeanAveragePrecision` takes torchmetrics MeanAveragePrecision's arguments, inputs
and output keys, and evaluates every class in the one COCOeval pass it needs for the aggregate
numbers. All backends return the same numbers bit for bit, and those are pycocotools' own (to
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
    COCO_AREA_RANGES,
    COCO_IOU_THRESHOLDS,
    COCO_RECALL_THRESHOLDS,
    Accumulation,
    CocoBackend,
    CocoInputs,
    EvalGrid,
    IouType,
)
from detrkit.training.coco_backends.faster_coco_eval import FasterCocoEvalBackend
from detrkit.training.coco_backends.hotcoco import HotcocoBackend
from detrkit.training.coco_backends.rle import EncodedMasks, encode_masks, mask_areas, split_runs
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
# state name -> (the IoU type that needs it, None for all; dtype); every state holds one entry per image
_STATES: dict[str, tuple[str | None, torch.dtype]] = {
    "det_labels": (None, torch.int64),
    "det_counts": (None, torch.int64),
    "det_scores": (None, torch.float64),
    "gt_labels": (None, torch.int64),
    "gt_counts": (None, torch.int64),
    "gt_crowd": (None, torch.bool),
    "gt_area": (None, torch.float64),
    "det_boxes": ("bbox", torch.float64),
    "gt_boxes": ("bbox", torch.float64),
    "det_runs": ("segm", torch.int64),  # masks, run-length encoded
    "det_run_lengths": ("segm", torch.int64),
    "gt_runs": ("segm", torch.int64),
    "gt_run_lengths": ("segm", torch.int64),
    "mask_sizes": ("segm", torch.int64),  # (1, 2) height, width per image
}
_AREA_NAMES = ("small", "medium", "large")  # COCO_AREA_RANGES[1:]
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
    on arrival. `compute()` returns float32 tensors under torchmetrics' keys (prefixed `bbox_`
    and `segm_` when both IoU types are evaluated) and `classes` as int32.

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
        **kwargs: Any,
    ) -> None:
        _refuse_unsupported(extended_summary, average, kwargs)
        super().__init__(**kwargs, sync_on_compute=False)
        self.iou_types: tuple[IouType, ...] = _iou_types(iou_type)
        if box_format not in get_args(BoxFormat):
            raise ValueError(f"box_format must be one of {get_args(BoxFormat)}, got {box_format!r}")
        if num_classes is not None and (not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool)
                                        or num_classes < 1):
            raise ValueError(f"num_classes must be a positive int or None, got {num_classes!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"unknown COCO evaluation backend {backend!r}; choose one of {sorted(_BACKENDS)}")
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
        self._coco_backend = _BACKENDS[backend]()
        if self._coco_backend.requires_bbox and "bbox" not in self.iou_types:
            raise ValueError(f"backend {backend!r} evaluates masks only alongside boxes: use iou_type ('bbox', 'segm')")
        self._add_states()

    def _add_states(self) -> None:
        """One list per column, one entry per image; `*_counts` say how many rows each image has."""
        for name, (iou_type, _) in _STATES.items():
            if iou_type is None or iou_type in self.iou_types:
                self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: Sequence[dict[str, Tensor]], targets: Sequence[dict[str, Tensor]]) -> None:
        """Store one batch of images; shapes are checked, values are not read."""
        if len(preds) != len(targets):
            raise ValueError(f"got {len(preds)} predictions for {len(targets)} targets")
        for index, (pred, target) in enumerate(zip(preds, targets)):
            self._check(pred, ("scores", "labels"), f"preds[{index}]")
            self._check(target, ("labels",) + tuple(key for key in ("iscrowd", "area") if key in target), f"targets[{index}]")
            if "segm" in self.iou_types and pred["masks"].shape[-2:] != target["masks"].shape[-2:]:
                raise ValueError(f"image {index}: prediction masks are {tuple(pred['masks'].shape[-2:])}, target "
                                 f"masks {tuple(target['masks'].shape[-2:])}; resize them to one size")
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

    def _check(self, item: dict[str, Tensor], columns: tuple[str, ...], where: str) -> None:
        """Every column one row per label: (N,) columns, (N, 4) boxes, (N, H, W) masks."""
        required = columns + (("boxes",) if "bbox" in self.iou_types else ()) + (("masks",) if "segm" in self.iou_types else ())
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
        if "bbox" in self.iou_types and item["boxes"].numel() != 4 * count:
            raise ValueError(f"{where}: {count} labels but boxes of shape {tuple(item['boxes'].shape)}")
        if "segm" in self.iou_types and (item["masks"].ndim != 3 or len(item["masks"]) != count):
            raise ValueError(f"{where}: {count} labels but masks of shape {tuple(item['masks'].shape)}")

    def _store(self, item: dict[str, Tensor], side: str) -> int:
        """Append one checked image's labels, boxes and masks to `side`'s states; returns its count."""
        labels = item["labels"].detach()
        count = labels.numel()
        getattr(self, f"{side}_labels").append(labels.reshape(count).to(torch.int64))
        getattr(self, f"{side}_counts").append(torch.full((1,), count, dtype=torch.int64, device=labels.device))
        if "bbox" in self.iou_types:
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
            accumulation = self._accumulate(self._inputs(state, iou_type, classes))
            summary = _summary(accumulation, self.grid)
            if self.class_metrics:
                summary |= _per_class(accumulation, self.grid)
            else:
                summary |= {"map_per_class": -1.0, f"mar_{self.grid.max_dets[-1]}_per_class": -1.0}
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

    def _accumulate(self, inputs: CocoInputs) -> Accumulation:
        if len(inputs.dt_scores) == 0 or len(inputs.gt_areas) == 0:
            return _without_matches(inputs, self.grid)
        accumulation = self._coco_backend.accumulate(inputs, self.grid)
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
        )

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
    if not types or any(kind not in ("bbox", "segm") for kind in types) or len(set(types)) != len(types):
        raise ValueError(f"iou_type must be 'bbox', 'segm' or both, got {iou_type!r}")
    return types


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


def _without_matches(inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
    """What COCOeval accumulates when nothing can match: 0 where a category and area range has
    ground truth to find (crowds aside), -1 elsewhere."""
    shape = (len(grid.iou_thresholds), len(inputs.category_ids), len(COCO_AREA_RANGES), len(grid.max_dets))
    found = np.zeros(shape[1:3], dtype=bool)  # (K, A)
    counted = inputs.gt_crowd == 0
    for area_index, (low, high) in enumerate(COCO_AREA_RANGES):
        in_range = counted & (inputs.gt_areas >= low) & (inputs.gt_areas <= high)
        found[:, area_index] = np.isin(inputs.category_ids, inputs.gt_category_ids[in_range])
    recall = np.where(found[None, :, :, None], 0.0, -1.0) * np.ones(shape)
    precision = np.repeat(recall[:, None], len(grid.recall_thresholds), axis=1)
    return Accumulation(precision, recall)


def _mean(values: np.ndarray) -> float:
    """COCOeval.summarize's mean over the entries that are not -1 (or -1 if none is)."""
    kept = values[values > -1]
    return float(np.mean(kept)) if kept.size else -1.0


def _summary(accumulation: Accumulation, grid: EvalGrid) -> dict[str, float]:
    """COCOeval.summarize(): AP at the largest max detections, AR at each."""
    precision, recall = accumulation.precision, accumulation.recall  # (T, R, K, A, M), (T, K, A, M)
    thresholds = np.asarray(grid.iou_thresholds)
    summary = {
        "map": _mean(precision[:, :, :, 0, -1]),
        "map_50": _mean(precision[thresholds == 0.5][:, :, :, 0, -1]),
        "map_75": _mean(precision[thresholds == 0.75][:, :, :, 0, -1]),
    }
    summary |= {f"map_{name}": _mean(precision[:, :, :, index + 1, -1]) for index, name in enumerate(_AREA_NAMES)}
    summary |= {f"mar_{limit}": _mean(recall[:, :, 0, index]) for index, limit in enumerate(grid.max_dets)}
    summary |= {f"mar_{name}": _mean(recall[:, :, index + 1, -1]) for index, name in enumerate(_AREA_NAMES)}
    return summary


def _per_class(accumulation: Accumulation, grid: EvalGrid) -> dict[str, list[float]]:
    """Per-class AP and AR (area all, largest max detections), -1 for classes without ground truth."""
    precision, recall = accumulation.precision, accumulation.recall
    classes = range(precision.shape[2])
    return {
        "map_per_class": [_mean(precision[:, :, k, 0, -1]) for k in classes],
        f"mar_{grid.max_dets[-1]}_per_class": [_mean(recall[:, k, 0, -1]) for k in classes],
    }
