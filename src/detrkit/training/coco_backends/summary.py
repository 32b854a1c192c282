"""COCOeval.summarize()'s arithmetic on accumulated arrays, under torchmetrics' key names."""

from __future__ import annotations

import numpy as np

from detrkit.training.coco_backends.base import Accumulation, EvalGrid, IouType


def mean_kept(values: np.ndarray) -> float:
    """COCOeval.summarize's mean over the entries that are not -1 (or -1 if none is)."""
    kept = values[values > -1]
    return float(np.mean(kept)) if kept.size else -1.0


def summarize(accumulation: Accumulation, grid: EvalGrid, iou_type: IouType) -> dict[str, float]:
    """AP at the largest max detections, AR at each, both per area range; keypoints (one max
    detections, 20) also give AR at OKS 0.5 and 0.75, as COCOeval's keypoint summary does."""
    precision, recall = accumulation.precision, accumulation.recall  # (T, R, K, A, M), (T, K, A, M)
    thresholds = np.asarray(grid.iou_thresholds)
    areas = list(enumerate(grid.area_names))[1:]
    summary = {
        "map": mean_kept(precision[:, :, :, 0, -1]),
        "map_50": mean_kept(precision[thresholds == 0.5][:, :, :, 0, -1]),
        "map_75": mean_kept(precision[thresholds == 0.75][:, :, :, 0, -1]),
    }
    summary |= {f"map_{name}": mean_kept(precision[:, :, :, index, -1]) for index, name in areas}
    summary |= {f"mar_{limit}": mean_kept(recall[:, :, 0, index]) for index, limit in enumerate(grid.max_dets)}
    if iou_type == "keypoints":
        summary |= {"mar_50": mean_kept(recall[thresholds == 0.5][:, :, 0, -1]),
                    "mar_75": mean_kept(recall[thresholds == 0.75][:, :, 0, -1])}
    summary |= {f"mar_{name}": mean_kept(recall[:, :, index, -1]) for index, name in areas}
    return summary


def per_class(accumulation: Accumulation, grid: EvalGrid) -> dict[str, list[float]]:
    """Per-class AP and AR (area all, largest max detections), -1 for classes without ground truth."""
    precision, recall = accumulation.precision, accumulation.recall
    classes = range(precision.shape[2])
    return {
        "map_per_class": [mean_kept(precision[:, :, k, 0, -1]) for k in classes],
        f"mar_{grid.max_dets[-1]}_per_class": [mean_kept(recall[:, k, 0, -1]) for k in classes],
    }
