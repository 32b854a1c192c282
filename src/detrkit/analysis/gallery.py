"""Galleries of validation images: ground truth beside predictions, true/false positives and misses marked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Rectangle
from PIL import Image
from torchvision.ops import box_iou

from detrkit.analysis.confusion import pair_by_iou

TRUTH, TRUE_POSITIVE, FALSE_POSITIVE, MISSED = "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e"


@dataclass(frozen=True)
class ImageOutcome:
    """One image at a confidence threshold: which kept detections are right, which boxes were missed."""

    kept: np.ndarray  # (K,) indices of the detections scored >= threshold
    true_positive: np.ndarray  # (K,) bool
    missed: np.ndarray  # (G,) bool over the non-crowd boxes

    @property
    def errors(self) -> int:
        return int((~self.true_positive).sum() + self.missed.sum())


def image_outcome(detection: dict[str, torch.Tensor], truth: dict[str, torch.Tensor], threshold: float,
                  iou_threshold: float = 0.5) -> ImageOutcome:
    """Detections >= threshold paired one to one with boxes of their class, highest IoU first."""
    kept = np.flatnonzero(detection["scores"].reshape(-1).numpy() >= threshold)
    crowd = truth.get("iscrowd", torch.zeros_like(truth["labels"])).reshape(-1).bool()
    labels = truth["labels"].reshape(-1)[~crowd]
    iou = box_iou(detection["boxes"].reshape(-1, 4)[kept].double(), truth["boxes"].reshape(-1, 4)[~crowd].double())
    same = detection["labels"].reshape(-1)[kept][:, None] == labels[None, :]
    pairs = pair_by_iou((iou * same).numpy(), iou_threshold)
    hit, found = np.zeros(len(kept), dtype=bool), np.zeros(len(labels), dtype=bool)
    for d, g in pairs:
        hit[d], found[g] = True, True
    return ImageOutcome(kept, hit, ~found)


def plot_gallery(paths: Sequence[Path], detections: Sequence[dict[str, torch.Tensor]],
                 truth: Sequence[dict[str, torch.Tensor]], indices: Sequence[int], class_names: Sequence[str],
                 threshold: float, path: Path, title: str) -> Path:
    """One row per image in `indices`: ground truth left, predictions right (true positives green,
    false positives red, missed boxes dashed orange)."""
    rows = max(len(indices), 1)
    figure, axes = plt.subplots(rows, 2, figsize=(8, 3.2 * rows), layout="constrained", squeeze=False)
    for row, index in enumerate(indices):
        image = np.asarray(Image.open(paths[index]).convert("RGB"))
        outcome = image_outcome(detections[index], truth[index], threshold)
        crowd = truth[index].get("iscrowd", torch.zeros_like(truth[index]["labels"])).reshape(-1).bool()
        boxes, labels = truth[index]["boxes"][~crowd].tolist(), truth[index]["labels"][~crowd].tolist()
        left, right = axes[row]
        for axis in (left, right):
            axis.imshow(image)
            axis.set_axis_off()
        left.set_title(f"{Path(paths[index]).name}: ground truth ({len(boxes)})", fontsize=9)
        for box, label in zip(boxes, labels):
            _box(left, box, TRUTH, _name(class_names, label))
        for box, label, missed in zip(boxes, labels, outcome.missed):
            if missed:
                _box(right, box, MISSED, f"missed {_name(class_names, label)}", dashed=True)
        detection = detections[index]
        for k, d in enumerate(outcome.kept.tolist()):
            colour = TRUE_POSITIVE if outcome.true_positive[k] else FALSE_POSITIVE
            _box(right, detection["boxes"][d].tolist(), colour,
                 f"{_name(class_names, int(detection['labels'][d]))} {float(detection['scores'][d]):.2f}")
        right.set_title(f">= {threshold:.2f}: {int(outcome.true_positive.sum())} right, "
                        f"{int((~outcome.true_positive).sum())} false, {int(outcome.missed.sum())} missed", fontsize=9)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def worst_images(detections: Sequence[dict[str, torch.Tensor]], truth: Sequence[dict[str, torch.Tensor]],
                 threshold: float, count: int) -> list[int]:
    """The `count` images with the most false positives plus misses (ties: data set order); only images with errors."""
    errors = [image_outcome(d, t, threshold).errors for d, t in zip(detections, truth, strict=True)]
    order = sorted(range(len(errors)), key=lambda i: -errors[i])
    return [i for i in order[:count] if errors[i] > 0]


def _box(axis, box: Sequence[float], colour: str, text: str, dashed: bool = False) -> None:
    """A box with its label above it (missed boxes: below, clear of a detection's label)."""
    x0, y0, x1, y1 = box
    axis.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linewidth=1.8,
                             linestyle="--" if dashed else "-"))
    axis.text(x0, y1 if dashed else y0, text, fontsize=7, color="white", va="top" if dashed else "bottom",
              bbox={"facecolor": colour, "edgecolor": "none", "pad": 1, "alpha": 0.85})


def _name(class_names: Sequence[str], label: int) -> str:
    return class_names[label] if 0 <= label < len(class_names) else f"class {label}"
