"""Precision-recall curve of each class at IoU 0.5, from validation's greedy matching."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from detrkit.training.confidence_sweep import greedy_matches

_RECALLS = np.linspace(0.0, 1.0, 101)


@dataclass(frozen=True)
class PrecisionRecall:
    """One class's curve: a point per detection, best score first, and its 101-point AP."""

    label: int
    recall: np.ndarray
    precision: np.ndarray
    ap: float


def precision_recall_curves(detections: Sequence[dict[str, torch.Tensor]],
                            truth: Sequence[dict[str, torch.Tensor]]) -> list[PrecisionRecall]:
    """Curves of the classes with ground truth (detections matched as the confidence sweep matches)."""
    matches = greedy_matches(detections, truth)
    curves = []
    for label, count in zip(matches.gt_classes.tolist(), matches.gt_counts.tolist()):
        mine = matches.labels == label
        order = np.argsort(-matches.scores[mine], kind="stable")
        hits = matches.true_positive[mine][order].astype(np.float64)
        true_positives = np.cumsum(hits)
        recall = true_positives / count
        precision = true_positives / np.arange(1, len(hits) + 1)
        curves.append(PrecisionRecall(label, recall, precision, interpolated_ap(recall, precision)))
    return curves


def interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """COCO's 101-point AP: the mean over recall levels of the best precision at that recall or beyond."""
    if len(recall) == 0:
        return 0.0
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    indices = np.searchsorted(recall, _RECALLS, side="left")
    return float(np.where(indices < len(envelope), envelope[np.minimum(indices, len(envelope) - 1)], 0.0).mean())
