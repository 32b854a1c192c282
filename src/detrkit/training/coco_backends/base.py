"""The contract between OnePassCocoMeanAveragePrecision and its COCO evaluation backends.

A backend receives one IoU type's ground truth and detections as COCO-shaped arrays
(`CocoInputs`) plus the evaluation grid (`EvalGrid`), and returns COCOeval's accumulated
precision and recall arrays (`Accumulation`). Everything a backend could get wrong before it
starts (ids, xywh conversion, areas, crowd flags, detection order, keypoint sigmas) is settled
here, once.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar, Literal

import numpy as np

IouType = Literal["bbox", "segm", "keypoints"]
IOU_TYPES: tuple[IouType, ...] = ("bbox", "segm", "keypoints")

# pycocotools' default grids, built exactly as COCOeval's Params builds them
COCO_IOU_THRESHOLDS = tuple(np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True).tolist())
COCO_RECALL_THRESHOLDS = tuple(np.linspace(0.0, 1.0, int(np.round((1.0 - 0.0) / 0.01)) + 1, endpoint=True).tolist())
# COCOeval's area ranges (all, small, medium, large), in pixels
COCO_AREA_RANGES = ((0.0, 1e5**2), (0.0, 32.0**2), (32.0**2, 96.0**2), (96.0**2, 1e5**2))
COCO_AREA_NAMES = ("all", "small", "medium", "large")
# COCOeval's keypoint Params: no "small" range, and AP and AR read at 20 detections per image
KEYPOINT_AREA_RANGES = ((0.0, 1e5**2), (32.0**2, 96.0**2), (96.0**2, 1e5**2))
KEYPOINT_AREA_NAMES = ("all", "medium", "large")
KEYPOINT_MAX_DETS = (20,)


@dataclass(frozen=True)
class EvalGrid:
    """COCOeval's Params: IoU (or OKS) thresholds (T), recall thresholds (R), max detections (M)
    and area ranges (A), the first of which is "all"."""

    iou_thresholds: tuple[float, ...]
    recall_thresholds: tuple[float, ...]
    max_dets: tuple[int, ...]
    area_ranges: tuple[tuple[float, float], ...] = COCO_AREA_RANGES
    area_names: tuple[str, ...] = COCO_AREA_NAMES


@dataclass(frozen=True)
class CocoInputs:
    """One IoU type's evaluation input as COCO would hold it.

    Image and annotation ids are 1-based (COCOeval treats a matched ground-truth id of 0 as
    "unmatched"), boxes are xywh float64, detections keep the order they were given in (ties
    in score are broken by it), and `gt_areas` is the area COCOeval buckets ground truth by.
    Masks are COCO uncompressed run lengths (uint32), one array per annotation. Keypoints are
    (x, y, v) rows in pixels, K per annotation; a detection's third column is not read, and
    ground truth with no keypoint labelled (v = 0 throughout) is ignored, as COCOeval does.
    """

    iou_type: IouType
    image_ids: np.ndarray  # (M,) int64
    image_sizes: np.ndarray  # (M, 2) int64 height, width; 0 where no mask says
    category_ids: np.ndarray  # (K,) int64, sorted
    gt_image_ids: np.ndarray  # (G,) int64
    gt_category_ids: np.ndarray  # (G,) int64
    gt_boxes: np.ndarray  # (G, 4) float64 xywh
    gt_areas: np.ndarray  # (G,) float64
    gt_crowd: np.ndarray  # (G,) int64, 0 or 1
    dt_image_ids: np.ndarray  # (D,) int64
    dt_category_ids: np.ndarray  # (D,) int64
    dt_boxes: np.ndarray  # (D, 4) float64 xywh
    dt_scores: np.ndarray  # (D,) float64
    gt_rles: list[np.ndarray] | None = None  # segm only
    dt_rles: list[np.ndarray] | None = None  # segm only
    gt_keypoints: np.ndarray | None = None  # (G, K, 3) float64, keypoints only
    dt_keypoints: np.ndarray | None = None  # (D, K, 3) float64, keypoints only
    keypoint_sigmas: np.ndarray | None = None  # (K,) float64 OKS sigmas, keypoints only

    @property
    def gt_ids(self) -> np.ndarray:
        return np.arange(1, len(self.gt_image_ids) + 1, dtype=np.int64)

    def gt_sizes(self) -> np.ndarray:
        """(G, 2) height, width of each ground truth's image."""
        return self.image_sizes[self.gt_image_ids - 1]

    def dt_sizes(self) -> np.ndarray:
        """(D, 2) height, width of each detection's image."""
        return self.image_sizes[self.dt_image_ids - 1]

    def detection_matrix(self) -> np.ndarray:
        """(D, 7) float64 rows of image_id, x, y, w, h, score, category_id: loadRes' array form."""
        columns = [self.dt_image_ids, self.dt_boxes, self.dt_scores, self.dt_category_ids]
        return np.ascontiguousarray(np.column_stack(columns), dtype=np.float64)

    def gt_num_keypoints(self) -> np.ndarray:
        """(G,) int64 labelled keypoints of each ground truth (v > 0)."""
        return (self.gt_keypoints[..., 2] > 0).sum(-1).astype(np.int64)

    def dt_keypoint_boxes(self) -> np.ndarray:
        """(D, 4) float64 xywh extent of each detection's keypoints, every one of them counted:
        the box (and so the area) loadRes gives a keypoint result."""
        xy = self.dt_keypoints[..., :2]  # (D, K, 2)
        low, high = xy.min(1), xy.max(1)
        return np.ascontiguousarray(np.concatenate([low, high - low], 1))

    def keypoint_results(self) -> list[dict]:
        """Keypoint detections as a keypoints results file holds them: no box, so loadRes takes
        the keypoints' extent."""
        return [
            {"image_id": image_id, "category_id": category, "score": score, "keypoints": keypoints}
            for image_id, category, score, keypoints in zip(
                self.dt_image_ids.tolist(), self.dt_category_ids.tolist(), self.dt_scores.tolist(),
                self.dt_keypoints.reshape(len(self.dt_keypoints), -1).tolist())
        ]


@dataclass(frozen=True)
class Accumulation:
    """COCOeval.accumulate()'s arrays; -1 where a category has no ground truth."""

    precision: np.ndarray  # (T, R, K, A, M) float64
    recall: np.ndarray  # (T, K, A, M) float64


class CocoBackend(ABC):
    """A COCO evaluator package behind one registry name.

    Subclasses name their import `package` and pip `distribution`, set `requires_bbox` when
    they cannot evaluate masks without boxes, and list the IoU types they evaluate in
    `iou_types`. Construction imports the package, so a missing one fails when the metric is
    built, not after the first validation epoch.
    """

    package: ClassVar[str]
    distribution: ClassVar[str]
    requires_bbox: ClassVar[bool] = False
    iou_types: ClassVar[tuple[IouType, ...]] = IOU_TYPES

    def __init__(self) -> None:
        self.module  # noqa: B018 - import now to fail early

    @property
    def module(self) -> ModuleType:
        """The package; not kept on the instance, so metrics holding a backend deep-copy."""
        return import_backend(self.package, self.distribution)

    @abstractmethod
    def accumulate(self, inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
        """COCOeval's evaluate() and accumulate() over all of `inputs.category_ids`."""


def without_matches(inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
    """What COCOeval accumulates when nothing can match (no detection or no ground truth): 0
    where a category and area range has ground truth to find, -1 elsewhere. Ground truth that
    COCOeval ignores (crowds, and for keypoints those with none labelled) finds nothing."""
    shape = (len(grid.iou_thresholds), len(inputs.category_ids), len(grid.area_ranges), len(grid.max_dets))
    found = np.zeros(shape[1:3], dtype=bool)  # (K, A)
    counted = inputs.gt_crowd == 0
    if inputs.iou_type == "keypoints":
        counted &= inputs.gt_num_keypoints() > 0
    for area_index, (low, high) in enumerate(grid.area_ranges):
        in_range = counted & (inputs.gt_areas >= low) & (inputs.gt_areas <= high)
        found[:, area_index] = np.isin(inputs.category_ids, inputs.gt_category_ids[in_range])
    recall = np.where(found[None, :, :, None], 0.0, -1.0) * np.ones(shape)
    precision = np.repeat(recall[:, None], len(grid.recall_thresholds), axis=1)
    return Accumulation(precision, recall)


def import_backend(package: str, distribution: str) -> ModuleType:
    """Import an evaluator package, or say which install extra provides it."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise ImportError(
            f"the COCO evaluation backend needs '{distribution}', which is not installed; "
            "install the training extra: pip install 'detrkit[train]'"
        ) from error
