"""Macro F1, precision and recall of a validation set at the confidence threshold that maximises F1.

Detections are matched greedily at IoU 0.5, per image and class, in descending score order
(ties keep their given order): each takes the unmatched ground truth it overlaps most. Greedy
decisions never depend on lower-scored detections, so the matches at any confidence threshold
are those of all detections cut at that score, and one matching serves every threshold.
Crowd regions (`iscrowd`) are left out of the ground truth. Classes are macro-averaged over
those with ground truth; a class with nothing detected has precision 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

DEFAULT_THRESHOLDS = np.linspace(0.0, 1.0, 101)


@dataclass(frozen=True)
class Matches:
    """Every detection's score, label and match flag, and the ground truth count per class."""

    scores: np.ndarray  # (D,) float64
    labels: np.ndarray  # (D,) int64
    true_positive: np.ndarray  # (D,) bool
    gt_classes: np.ndarray  # (K,) int64, sorted
    gt_counts: np.ndarray  # (K,) int64


@dataclass(frozen=True)
class ConfidenceSweep:
    """Per-class and macro precision, recall and F1 at each confidence threshold."""

    thresholds: np.ndarray  # (C,)
    classes: np.ndarray  # (K,) classes with ground truth
    per_class_precision: np.ndarray  # (K, C)
    per_class_recall: np.ndarray  # (K, C)
    per_class_f1: np.ndarray  # (K, C)

    @property
    def precision(self) -> np.ndarray:
        return _macro(self.per_class_precision)

    @property
    def recall(self) -> np.ndarray:
        return _macro(self.per_class_recall)

    @property
    def f1(self) -> np.ndarray:
        return _macro(self.per_class_f1)

    @property
    def best(self) -> int:
        """Index of the highest macro F1; the lowest threshold among equals."""
        return int(np.argmax(self.f1))

    @property
    def best_threshold(self) -> float:
        return float(self.thresholds[self.best])

    @property
    def best_f1(self) -> float:
        return float(self.f1[self.best])

    @property
    def best_precision(self) -> float:
        return float(self.precision[self.best])

    @property
    def best_recall(self) -> float:
        return float(self.recall[self.best])


def sweep_confidence(
    preds: Sequence[dict[str, Tensor]],
    targets: Sequence[dict[str, Tensor]],
    iou_threshold: float = 0.5,
    thresholds: np.ndarray = DEFAULT_THRESHOLDS,
) -> ConfidenceSweep:
    """Sweep torchmetrics-style per-image dicts (xyxy `boxes`, `scores`, `labels`; targets
    `boxes`, `labels`, optional `iscrowd`)."""
    return sweep_matches(greedy_matches(preds, targets, iou_threshold), thresholds)


def greedy_matches(
    preds: Sequence[dict[str, Tensor]], targets: Sequence[dict[str, Tensor]], iou_threshold: float = 0.5
) -> Matches:
    """Match every image's detections to its ground truth, greedily by descending score."""
    if len(preds) != len(targets):
        raise ValueError(f"got {len(preds)} predictions for {len(targets)} targets")
    scores, labels, hits, gt_labels = [], [], [], []
    for pred, target in zip(preds, targets):
        keep = target.get("iscrowd", torch.zeros_like(target["labels"])).reshape(-1) == 0
        target_labels = target["labels"].reshape(-1)[keep].cpu().long()
        gt_labels.append(target_labels)
        pred_labels, pred_scores = pred["labels"].reshape(-1).cpu().long(), pred["scores"].reshape(-1).cpu().double()
        ious = box_iou(pred["boxes"].reshape(-1, 4).cpu().double(), target["boxes"].reshape(-1, 4)[keep].cpu().double())
        candidates = (ious >= iou_threshold) & (pred_labels[:, None] == target_labels[None, :])  # (D, G)
        hits.append(_greedy(pred_scores.numpy(), ious.numpy(), candidates.numpy()))
        scores.append(pred_scores)
        labels.append(pred_labels)
    gt_classes, gt_counts = np.unique(_cat(gt_labels, torch.int64).numpy(), return_counts=True)
    return Matches(
        scores=_cat(scores, torch.float64).numpy(),
        labels=_cat(labels, torch.int64).numpy(),
        true_positive=np.concatenate(hits) if hits else np.zeros(0, dtype=bool),
        gt_classes=gt_classes,
        gt_counts=gt_counts,
    )


def sweep_matches(matches: Matches, thresholds: np.ndarray = DEFAULT_THRESHOLDS) -> ConfidenceSweep:
    """Precision, recall and F1 of each class with ground truth, keeping scores >= each threshold."""
    shape = (len(matches.gt_classes), len(thresholds))
    true_positives, detections = np.zeros(shape), np.zeros(shape)
    for row, label in enumerate(matches.gt_classes):
        mine = matches.labels == label
        detections[row] = _at_least(matches.scores[mine], thresholds)
        true_positives[row] = _at_least(matches.scores[mine & matches.true_positive], thresholds)
    precision = np.divide(true_positives, detections, out=np.zeros(shape), where=detections > 0)
    recall = true_positives / matches.gt_counts[:, None]
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros(shape), where=total > 0)
    return ConfidenceSweep(np.asarray(thresholds), matches.gt_classes, precision, recall, f1)


def _greedy(scores: np.ndarray, ious: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """(D,) match flags: by descending score, each detection takes its best unmatched candidate."""
    hit = np.zeros(len(scores), dtype=bool)
    free = np.ones(ious.shape[1], dtype=bool)
    order = np.argsort(-scores, kind="stable")
    for index in order[candidates[order].any(axis=1)]:  # detections that can match at all
        options = candidates[index] & free
        if options.any():
            best = int(np.argmax(np.where(options, ious[index], -1.0)))  # first of equal IoUs
            free[best] = False
            hit[index] = True
    return hit


def _at_least(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """How many of `scores` are >= each threshold."""
    return len(scores) - np.searchsorted(np.sort(scores), thresholds, side="left")


def _macro(per_class: np.ndarray) -> np.ndarray:
    """Mean over classes; 0 at every threshold when no class has ground truth."""
    return per_class.mean(axis=0) if len(per_class) else np.zeros(per_class.shape[1])


def _cat(tensors: list[Tensor], dtype: torch.dtype) -> Tensor:
    return torch.cat(tensors).to(dtype) if tensors else torch.zeros(0, dtype=dtype)
