"""TIDE error breakdown (Bolya et al., 2020): how much AP@50 each kind of error costs, and how many there are.

Per image, detections (best score first, at most `max_dets`) are matched to ground truth of
their class at IoU >= 0.5, each taking the free box it overlaps most; a detection that is
not matched (or lies inside a crowd region of its class, which drops it from the AP) is one
error, the first of these that applies:
  localisation    its class's best box overlaps it by 0.1 .. 0.5,
  classification  a box of another class overlaps it by >= 0.5,
  duplicate       a box of its class that another detection matched overlaps it by >= 0.5,
  background      no box overlaps it by more than 0.1,
  both            otherwise (wrong class and poorly placed).
A box nothing matched, and that no localisation or classification error points at, is missed.
Fixing a kind: localisation and classification errors become true positives (of the box's
class; one per box, the highest scored, the others are dropped), duplicates and background
and both are dropped, missed boxes leave the ground truth. dAP is the AP gained, at least 0.
AP is TIDE's: the mean over classes with ground truth or detections of the 101-point
interpolated AP, and these are the definitions of the `tidecv` package, which a test checks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.ops import box_iou

ERROR_TYPES = ("classification", "localisation", "both", "duplicate", "background", "missed")
_RECALLS = np.arange(101) / 100


@dataclass(frozen=True)
class TideBreakdown:
    """AP@50 (TIDE's, as a fraction), the AP gained by fixing each error type alone, the counts,
    and the AP gained with no false positives or no false negatives at all."""

    ap: float
    delta: dict[str, float]  # ERROR_TYPES -> dAP (fraction of 1)
    counts: dict[str, int]
    false_positive_delta: float
    false_negative_delta: float
    errors_per_image: list[int]


@dataclass
class _Error:
    kind: str
    label: int  # the detection's class (the box's for missed)
    score: float
    counted: bool  # whether the detection is in the AP (not inside a crowd region)
    fix_label: int = -1
    target: tuple[int, int] | None = None  # (image, box) a localisation/classification fix claims
    suppressed: bool = True
    key: int = -1  # which detection it is


class _Run:
    def __init__(self, pos_thresh: float, bg_thresh: float, max_dets: int) -> None:
        self.pos, self.bg, self.max_dets = pos_thresh, bg_thresh, max_dets
        self.gt_positives: dict[int, int] = defaultdict(int)
        self.points: dict[int, list[tuple[float, bool]]] = defaultdict(list)  # the AP's data points
        self.errors: list[_Error] = []
        self.best: dict[tuple[int, int], tuple[float, int]] = {}  # box -> best claiming (score, detection)
        self.false_negatives: dict[int, int] = defaultdict(int)
        self.per_image: list[int] = []
        self._keys = 0

    def image(self, index: int, detection: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> None:
        before = len(self.errors)
        crowd = truth.get("iscrowd", torch.zeros_like(truth["labels"])).reshape(-1).bool()
        boxes, labels = truth["boxes"].reshape(-1, 4).double(), truth["labels"].reshape(-1).long()
        gt_boxes, gt_labels = boxes[~crowd], labels[~crowd].tolist()
        for label in gt_labels:
            self.gt_positives[label] += 1
        order = np.argsort(-detection["scores"].reshape(-1).double().numpy(), kind="stable")[: self.max_dets]
        scores = detection["scores"].reshape(-1).double().numpy()[order]
        pred_labels = detection["labels"].reshape(-1).long().numpy()[order]
        pred_boxes = detection["boxes"].reshape(-1, 4).double()[torch.from_numpy(order)]
        if len(order) == 0:
            for label in gt_labels:
                self.false_negatives[label] += 1
                self.errors.append(_Error("missed", label, 0.0, False))
        else:
            self._classify(index, scores, pred_labels, pred_boxes, gt_boxes, np.asarray(gt_labels, dtype=np.int64),
                           boxes[crowd], labels[crowd].numpy())
        self.per_image.append(len(self.errors) - before)

    def _classify(self, index, scores, pred_labels, pred_boxes, gt_boxes, gt_labels, crowd_boxes, crowd_labels):
        iou = box_iou(pred_boxes, gt_boxes).numpy()  # (D, G)
        same = pred_labels[:, None] == gt_labels[None, :]
        cls_iou = iou * same
        used = np.zeros(len(scores), dtype=np.int8)  # 1 matched, 0 not, -1 inside a crowd region
        gt_used, usable = np.zeros(len(gt_labels), dtype=bool), np.zeros(len(gt_labels), dtype=bool)
        if len(gt_labels):
            buffer = cls_iou.copy()
            for p in range(len(scores)):
                g = int(np.argmax(buffer[p]))
                if buffer[p, g] >= self.pos:
                    used[p], gt_used[g] = 1, True
                    buffer[:, g] = 0
        if len(crowd_labels):
            ioa = _intersection_over_detection(pred_boxes, crowd_boxes)  # (D, R)
            for r in range(len(crowd_labels)):
                used[(used == 0) & (ioa[:, r] > self.pos) & (pred_labels == crowd_labels[r])] = -1
        used_cls = iou * same * gt_used[None, :]
        other_cls = iou * ~same
        for p in range(len(scores)):
            label, score, key = int(pred_labels[p]), float(scores[p]), self._keys
            self._keys += 1
            if used[p] != -1:
                self.points[label].append((score, bool(used[p] == 1)))
            if used[p] == 1:
                continue
            error = _Error("background", label, score, used[p] != -1, key=key)
            if len(gt_labels):
                error.kind = self._kind(cls_iou[p], other_cls[p], used_cls[p], iou[p])
            if error.kind in ("localisation", "classification"):
                g = int(np.argmax(cls_iou[p] if error.kind == "localisation" else other_cls[p]))
                error.fix_label = label if error.kind == "localisation" else int(gt_labels[g])
                error.target, error.suppressed = (index, g), bool(gt_used[g])
                if not gt_used[g]:
                    usable[g] = True
                    if self.best.get((index, g), (-1.0, -1))[0] < score:
                        self.best[(index, g)] = (score, key)
            self.errors.append(error)
        for g in np.flatnonzero(~gt_used):
            self.false_negatives[int(gt_labels[g])] += 1
            if not usable[g]:
                self.errors.append(_Error("missed", int(gt_labels[g]), 0.0, False))

    def _kind(self, cls_iou: np.ndarray, other_cls: np.ndarray, used_cls: np.ndarray, iou: np.ndarray) -> str:
        if self.bg <= cls_iou.max() <= self.pos:
            return "localisation"
        if other_cls.max() >= self.pos:
            return "classification"
        if used_cls.max() >= self.pos:
            return "duplicate"
        return "background" if iou.max() <= self.bg else "both"

    def true_points(self) -> dict[int, list[tuple[float, bool]]]:
        return {label: [p for p in points if p[1]] for label, points in self.points.items()}

    def fixed_map(self, kind: str | None = None, perfect_precision: bool = False, no_misses: bool = False) -> float:
        """TIDE's mAP with every error of `kind` fixed (or the special fixes)."""
        gt_positives = dict(self.gt_positives)
        points: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        for error in self.errors:
            if error.kind == kind:
                if kind == "missed":
                    gt_positives[error.label] -= 1
                elif (error.target is not None and not error.suppressed
                      and self.best[error.target][1] == error.key):
                    points[error.fix_label].append((error.score, True))
            elif error.counted:
                points[error.label].append((error.score, False))
        for label, true in self.true_points().items():
            points[label] += true
        if no_misses:
            gt_positives = {k: v - self.false_negatives.get(k, 0) for k, v in gt_positives.items()}
        if perfect_precision:
            points = {k: [(1.0 if t else 0.0, t) for _, t in v] for k, v in points.items()}
        return _mean_ap(points, gt_positives)


def tide_breakdown(detections: Sequence[dict[str, torch.Tensor]], truth: Sequence[dict[str, torch.Tensor]],
                   pos_thresh: float = 0.5, bg_thresh: float = 0.1, max_dets: int = 100) -> TideBreakdown:
    """The breakdown of per-image torchmetrics-style dicts (xyxy `boxes` in pixels, `scores`,
    `labels`; truth `boxes`, `labels`, optional `iscrowd`). Every image counts, with or without boxes."""
    run = _Run(pos_thresh, bg_thresh, max_dets)
    for index, (detection, image_truth) in enumerate(zip(detections, truth, strict=True)):
        run.image(index, detection, image_truth)
    base = _mean_ap(run.points, run.gt_positives)
    delta = {kind: max(run.fixed_map(kind) - base, 0.0) for kind in ERROR_TYPES}
    counts = {kind: sum(error.kind == kind for error in run.errors) for kind in ERROR_TYPES}
    return TideBreakdown(base, delta, counts, run.fixed_map(perfect_precision=True) - base,
                         run.fixed_map(no_misses=True) - base, run.per_image)


def _mean_ap(points: dict[int, list[tuple[float, bool]]], gt_positives: dict[int, int]) -> float:
    """Mean over classes with detections or ground truth; 0 with neither."""
    classes = [c for c in {**gt_positives, **points} if points.get(c) or gt_positives.get(c, 0) != 0]
    if not classes:
        return 0.0
    return sum(_average_precision(points.get(c, []), gt_positives.get(c, 0)) for c in classes) / len(classes)


def _average_precision(points: list[tuple[float, bool]], positives: int) -> float:
    """101-point interpolated AP of (score, correct) points; ties keep their order."""
    if positives == 0 or not points:
        return 0.0
    order = sorted(range(len(points)), key=lambda i: -points[i][0])
    correct = np.array([points[i][1] for i in order], dtype=np.float64)
    true_positives = np.cumsum(correct)
    precision = true_positives / np.arange(1, len(correct) + 1)
    precision = np.maximum.accumulate(precision[::-1])[::-1]  # the best precision at this recall or beyond
    indices = np.searchsorted(true_positives / positives, _RECALLS, side="left")
    return float(np.where(indices < len(precision), precision[np.minimum(indices, len(precision) - 1)], 0.0).sum()
                 / len(_RECALLS))


def _intersection_over_detection(boxes: torch.Tensor, regions: torch.Tensor) -> np.ndarray:
    """(D, R) share of each detection's area inside each region (COCO's crowd IoU)."""
    top_left = torch.maximum(boxes[:, None, :2], regions[None, :, :2])
    bottom_right = torch.minimum(boxes[:, None, 2:], regions[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).clamp(min=1e-12)
    return (inter / area[:, None]).numpy()
