"""The contract between OnePassCocoMeanAveragePrecision and its COCO evaluation backends.

A backend receives one IoU type's ground truth and detections as COCO-shaped arrays
(`CocoInputs`) plus the evaluation grid (`EvalGrid`), and returns COCOeval's accumulated
precision and recall arrays (`Accumulation`). Everything a backend could get wrong before it
starts (ids, xywh conversion, areas, crowd flags, detection order) is settled here, once.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar, Literal

import numpy as np

IouType = Literal["bbox", "segm"]

# pycocotools' default grids, built exactly as COCOeval's Params builds them
COCO_IOU_THRESHOLDS = tuple(np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True).tolist())
COCO_RECALL_THRESHOLDS = tuple(np.linspace(0.0, 1.0, int(np.round((1.0 - 0.0) / 0.01)) + 1, endpoint=True).tolist())
# COCOeval's area ranges (all, small, medium, large), in pixels
COCO_AREA_RANGES = ((0.0, 1e5**2), (0.0, 32.0**2), (32.0**2, 96.0**2), (96.0**2, 1e5**2))


@dataclass(frozen=True)
class EvalGrid:
    """COCOeval's Params: IoU thresholds (T), recall thresholds (R), max detections (M)."""

    iou_thresholds: tuple[float, ...]
    recall_thresholds: tuple[float, ...]
    max_dets: tuple[int, ...]


@dataclass(frozen=True)
class CocoInputs:
    """One IoU type's evaluation input as COCO would hold it.

    Image and annotation ids are 1-based (COCOeval treats a matched ground-truth id of 0 as
    "unmatched"), boxes are xywh float64, detections keep the order they were given in (ties
    in score are broken by it), and `gt_areas` is the area COCOeval buckets ground truth by.
    Masks are COCO uncompressed run lengths (uint32), one array per annotation.
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


@dataclass(frozen=True)
class Accumulation:
    """COCOeval.accumulate()'s arrays; -1 where a category has no ground truth."""

    precision: np.ndarray  # (T, R, K, A, M) float64
    recall: np.ndarray  # (T, K, A, M) float64


class CocoBackend(ABC):
    """A COCO evaluator package behind one registry name.

    Subclasses name their import `package` and pip `distribution`, and set `requires_bbox`
    when they cannot evaluate masks without boxes. Construction imports the package, so a
    missing one fails when the metric is built, not after the first validation epoch.
    """

    package: ClassVar[str]
    distribution: ClassVar[str]
    requires_bbox: ClassVar[bool] = False

    def __init__(self) -> None:
        self.module  # noqa: B018 - import now to fail early

    @property
    def module(self) -> ModuleType:
        """The package; not kept on the instance, so metrics holding a backend deep-copy."""
        return import_backend(self.package, self.distribution)

    @abstractmethod
    def accumulate(self, inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
        """COCOeval's evaluate() and accumulate() over all of `inputs.category_ids`."""


def import_backend(package: str, distribution: str) -> ModuleType:
    """Import an evaluator package, or say which install extra provides it."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise ImportError(
            f"the COCO evaluation backend needs '{distribution}', which is not installed; "
            "install the training extra: pip install 'detrkit[train]'"
        ) from error
