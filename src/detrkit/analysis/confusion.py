"""Confusion matrix of detections at a confidence threshold and IoU, with a background row and column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchvision.ops import box_iou


def confusion_matrix(detections: Sequence[dict[str, torch.Tensor]], truth: Sequence[dict[str, torch.Tensor]],
                     num_classes: int, threshold: float, iou_threshold: float = 0.5) -> np.ndarray:
    """(C + 1, C + 1) counts: row = true class, column = predicted class, index C = background.

    Per image, detections scored >= `threshold` and boxes (crowd regions left out) are paired
    one to one whatever their classes, the highest IoU first, while it is >= `iou_threshold`;
    an unpaired box counts as (class, background) (missed), an unpaired detection as
    (background, class) (a false positive). Labels >= num_classes count as background."""
    matrix = np.zeros((num_classes + 1, num_classes + 1), dtype=np.int64)
    for detection, image_truth in zip(detections, truth, strict=True):
        keep = detection["scores"].reshape(-1) >= threshold
        pred = _bounded(detection["labels"].reshape(-1)[keep], num_classes)
        crowd = image_truth.get("iscrowd", torch.zeros_like(image_truth["labels"])).reshape(-1).bool()
        true = _bounded(image_truth["labels"].reshape(-1)[~crowd], num_classes)
        iou = box_iou(detection["boxes"].reshape(-1, 4)[keep].double(),
                      image_truth["boxes"].reshape(-1, 4)[~crowd].double()).numpy()  # (D, G)
        pairs = pair_by_iou(iou, iou_threshold)
        for d, g in pairs:
            matrix[true[g], pred[d]] += 1
        paired_pred, paired_true = {d for d, _ in pairs}, {g for _, g in pairs}
        for g in set(range(len(true))) - paired_true:
            matrix[true[g], num_classes] += 1
        for d in set(range(len(pred))) - paired_pred:
            matrix[num_classes, pred[d]] += 1
    return matrix


def pair_by_iou(iou: np.ndarray, iou_threshold: float) -> list[tuple[int, int]]:
    """One-to-one (detection, box) pairs, the highest IoU first, while it is >= iou_threshold."""
    rows, columns = np.nonzero(iou >= iou_threshold)
    order = np.argsort(-iou[rows, columns], kind="stable")
    pairs, used_rows, used_columns = [], set(), set()
    for d, g in zip(rows[order].tolist(), columns[order].tolist()):
        if d not in used_rows and g not in used_columns:
            pairs.append((d, g))
            used_rows.add(d)
            used_columns.add(g)
    return pairs


def normalised(matrix: np.ndarray) -> np.ndarray:
    """Each row (true class) divided by its total: where that class's boxes went; 0 for empty rows."""
    totals = matrix.sum(axis=1, keepdims=True)
    return np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)


def _bounded(labels: torch.Tensor, num_classes: int) -> np.ndarray:
    values = labels.long().numpy()
    return np.where(values < num_classes, values, num_classes)
