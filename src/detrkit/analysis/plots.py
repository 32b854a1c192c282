"""The evaluation charts as PNGs (matplotlib, headless): confusion matrix, PR, confidence curves, TIDE bars."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from detrkit.analysis.confusion import normalised
from detrkit.analysis.curves import PrecisionRecall
from detrkit.analysis.tide import TideBreakdown
from detrkit.training.confidence_sweep import ConfidenceSweep

COLOURS = plt.get_cmap("tab10").colors


def plot_confusion(matrix: np.ndarray, class_names: Sequence[str], threshold: float, path: Path) -> Path:
    """Counts beside the row-normalised matrix (true class down, predicted across)."""
    names = [*class_names, "background"]
    size = max(4.0, 0.55 * len(names) + 2.5)
    figure, axes = plt.subplots(1, 2, figsize=(2 * size + 1, size + 0.6), layout="constrained")
    for axis, values, title in ((axes[0], matrix, "counts"), (axes[1], normalised(matrix), "normalised by true class")):
        image = axis.imshow(values, cmap="Blues", vmin=0)
        axis.set(xticks=range(len(names)), yticks=range(len(names)), xlabel="predicted", ylabel="true",
                 title=title)
        axis.set_xticklabels(names, rotation=45, ha="right")
        axis.set_yticklabels(names)
        peak = values.max() if values.size and values.max() > 0 else 1
        for (row, column), value in np.ndenumerate(values):
            if value:
                axis.text(column, row, f"{value:.2f}" if values.dtype.kind == "f" else str(value), ha="center",
                          va="center", fontsize=8, color="white" if value > peak / 2 else "black")
        figure.colorbar(image, ax=axis, shrink=0.8)
    figure.suptitle(f"confusion matrix at confidence >= {threshold:.2f}, IoU 0.5")
    return _save(figure, path)


def plot_precision_recall(curves: Sequence[PrecisionRecall], class_names: Sequence[str], path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6, 5), layout="constrained")
    for index, curve in enumerate(curves):
        if len(curve.precision):
            envelope = np.maximum.accumulate(curve.precision[::-1])[::-1]
            recall, precision = np.r_[0.0, curve.recall], np.r_[envelope[0], envelope]
        else:  # no detection of this class: a flat line at 0
            recall, precision = np.array([0.0, 1.0]), np.zeros(2)
        axis.plot(recall, precision, drawstyle="steps-pre", linewidth=1.5,
                  color=COLOURS[index % len(COLOURS)], label=f"{class_names[curve.label]} AP50 {curve.ap:.3f}")
    mean = np.mean([curve.ap for curve in curves]) if curves else 0.0
    axis.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="recall", ylabel="precision",
             title=f"precision-recall at IoU 0.5 (mean AP50 {mean:.3f})")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower left", fontsize=8)
    return _save(figure, path)


def plot_confidence_curves(sweep: ConfidenceSweep, class_names: Sequence[str], path: Path) -> Path:
    """F1, precision and recall against confidence: each class thin, the macro mean thick, best F1 marked."""
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
    best = sweep.best_threshold
    for axis, per_class, mean, name in ((axes[0], sweep.per_class_f1, sweep.f1, "F1"),
                                        (axes[1], sweep.per_class_precision, sweep.precision, "precision"),
                                        (axes[2], sweep.per_class_recall, sweep.recall, "recall")):
        for index, (label, values) in enumerate(zip(sweep.classes.tolist(), per_class)):
            axis.plot(sweep.thresholds, values, color=COLOURS[index % len(COLOURS)], linewidth=1, alpha=0.7,
                      label=class_names[label])
        axis.plot(sweep.thresholds, mean, color="black", linewidth=2.5,
                  label=f"all classes: {mean[sweep.best]:.3f} at {best:.2f}")
        axis.axvline(best, color="crimson", linestyle="--", linewidth=1)
        axis.plot([best], [mean[sweep.best]], "o", color="crimson")
        axis.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="confidence", ylabel=name, title=f"{name}-confidence")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _save(figure, path)


def plot_tide(breakdown: TideBreakdown, path: Path) -> Path:
    kinds = list(breakdown.delta)
    figure, axis = plt.subplots(figsize=(7, 4), layout="constrained")
    values = [100 * breakdown.delta[kind] for kind in kinds]
    bars = axis.bar(kinds, values, color=[COLOURS[i] for i in range(len(kinds))])
    for bar, kind in zip(bars, kinds):
        axis.annotate(f"{bar.get_height():.2f}\n({breakdown.counts[kind]})", (bar.get_x() + bar.get_width() / 2,
                      bar.get_height()), ha="center", va="bottom", fontsize=8)
    axis.set(ylabel="dAP50 (points)", ylim=(0, max(values + [1.0]) * 1.25),
             title=f"TIDE: AP50 {100 * breakdown.ap:.1f}; AP50 gained by fixing each error type (count)")
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
