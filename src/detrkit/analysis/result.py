"""EvaluationResult: what evaluate() returns, overall and per class, at the best confidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from detrkit.analysis.dataset_stats import DatasetStats
from detrkit.analysis.tide import TideBreakdown
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.confidence_sweep import ConfidenceSweep


@dataclass(frozen=True)
class ClassResult:
    """One class's COCO AP and AR, and precision, recall and F1 at its own best confidence."""

    name: str
    label: int
    instances: int
    ap: float  # AP at IoU 0.50:0.95; -1 where the class has no ground truth
    ar: float  # AR at eval_max_dets detections per image
    precision: float
    recall: float
    f1: float
    best_threshold: float


@dataclass(frozen=True)
class EvaluationResult:
    """evaluate()'s answer. `metrics` holds exactly the numbers validation logs (`val/<name>`
    in metrics.csv: mAP_50_95, mAP_50, mAP_75, mAR, precision, recall, F1, ...); the macro
    precision, recall and F1 are those at `best_threshold`, the confidence of the best macro F1."""

    split: str
    metrics: dict[str, float]
    coco_stats: list[float]  # COCOeval's twelve summary numbers
    per_class: list[ClassResult]
    sweep: ConfidenceSweep
    stats: DatasetStats
    errors: TideBreakdown
    detections: list[dict[str, torch.Tensor]] = field(repr=False)
    truth: list[dict[str, torch.Tensor]] = field(repr=False)
    image_paths: list[Path] = field(default_factory=list, repr=False)  # the split's images, in order
    class_names: list[str] = field(default_factory=list)
    keypoint_skeletons: list[list[tuple[int, int]]] = field(default_factory=list, repr=False)  # per class, 0-based
    plots: list[Path] = field(default_factory=list)  # the PNGs written for it

    @property
    def map_50_95(self) -> float:
        return self.metrics["mAP_50_95"]

    @property
    def map_50(self) -> float:
        return self.metrics["mAP_50"]

    @property
    def mar(self) -> float:
        return self.metrics["mAR"]

    @property
    def precision(self) -> float:
        return self.metrics["precision"]

    @property
    def recall(self) -> float:
        return self.metrics["recall"]

    @property
    def f1(self) -> float:
        return self.metrics["F1"]

    @property
    def best_threshold(self) -> float:
        return self.sweep.best_threshold

    def summary(self) -> str:
        """A table: the overall numbers, then one line per class."""
        lines = [f"{self.split}: {self.stats.images} images, {self.stats.instances} instances",
                 (f"mAP@50:95 {self.map_50_95:.4f}  mAP@50 {self.map_50:.4f}  mAR {self.mar:.4f}  "
                  f"P {self.precision:.4f}  R {self.recall:.4f}  F1 {self.f1:.4f} at confidence {self.best_threshold:.2f}"),
                 f"{'class':<20}{'inst':>6}{'AP':>8}{'AR':>8}{'P':>8}{'R':>8}{'F1':>8}{'conf':>7}"]
        lines += [f"{c.name:<20}{c.instances:>6}{c.ap:>8.4f}{c.ar:>8.4f}{c.precision:>8.4f}{c.recall:>8.4f}"
                  f"{c.f1:>8.4f}{c.best_threshold:>7.2f}" for c in self.per_class]
        return "\n".join(lines)


def per_class_results(detections: Sequence[dict[str, torch.Tensor]], truth: Sequence[dict[str, torch.Tensor]],
                      class_names: Sequence[str], sweep: ConfidenceSweep, stats: DatasetStats, max_dets: int,
                      backend: str) -> list[ClassResult]:
    """Every class's AP and AR (one COCO pass) and its best point on the confidence sweep."""
    metric = OnePassCocoMeanAveragePrecision(backend=backend, max_detection_thresholds=[1, 10, max_dets],
                                             class_metrics=True, num_classes=len(class_names),
                                             sync_on_compute=False)
    named = [d["labels"] < len(class_names) for d in detections]  # a head wider than the data set's classes
    metric.update([{k: d[k][keep] for k in ("boxes", "scores", "labels")} for d, keep in zip(detections, named)],
                  [{k: t[k] for k in ("boxes", "labels", "iscrowd", "area") if k in t} for t in truth])
    scores = metric.compute()
    ap = scores["map_per_class"].reshape(-1).tolist()
    ar = scores[f"mar_{max_dets}_per_class"].reshape(-1).tolist()
    rows = {int(label): row for row, label in enumerate(sweep.classes)}
    results = []
    for label, name in enumerate(class_names):
        best = (0.0, 0.0, 0.0, float("nan"))  # a class without ground truth has no best point
        if label in rows:
            row = rows[label]
            column = int(np.argmax(sweep.per_class_f1[row]))
            best = (float(sweep.per_class_precision[row, column]), float(sweep.per_class_recall[row, column]),
                    float(sweep.per_class_f1[row, column]), float(sweep.thresholds[column]))
        results.append(ClassResult(name, label, stats.instances_per_class[name], ap[label], ar[label], *best))
    return results
