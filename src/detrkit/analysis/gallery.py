"""Galleries of validation images: ground truth beside predictions (boxes, masks, keypoints), errors marked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from PIL import Image
from torchvision.ops import box_iou

from detrkit.analysis.confusion import pair_by_iou
from detrkit.analysis.drawing import Edges, class_name, draw_box, draw_keypoints, overlay_masks, show_image
from detrkit.training.coco_backends.rle import EncodedMasks, decode_runs, split_runs

TRUTH, TRUE_POSITIVE, FALSE_POSITIVE, MISSED = "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e"
KEYPOINT_SHOWN = 0.5  # a predicted keypoint is drawn where the model finds it at least this likely
MAX_DRAWN = 25  # predictions drawn per image at most, the best scored


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
                 threshold: float, path: Path, title: str, edges: Sequence[Edges] = ()) -> Path:
    """One row per image in `indices`: ground truth left, predictions right (true positives green,
    false positives red, missed boxes dashed orange). Masks are tinted in their box's colour and
    keypoints drawn with their class's skeleton (`edges`), where detections and truth have them."""
    rows = max(len(indices), 1)
    # a fixed layout: matplotlib's constrained one takes seconds on rows of labelled images
    figure, axes = plt.subplots(rows, 2, figsize=(8, 3.2 * rows + 0.4), squeeze=False,
                                gridspec_kw={"left": 0.01, "right": 0.99, "bottom": 0.01, "wspace": 0.04,
                                             "top": 1 - 0.45 / (3.2 * rows + 0.4), "hspace": 0.14})
    for row, index in enumerate(indices):
        image = np.asarray(Image.open(paths[index]).convert("RGB"))
        outcome = image_outcome(detections[index], truth[index], threshold)
        left, right = axes[row]
        show_image(left, image)
        show_image(right, image)
        count = draw_truth(left, truth[index], outcome, class_names, edges, right)
        left.set_title(f"{Path(paths[index]).name}: ground truth ({count})", fontsize=9)
        drawn = draw_predictions(right, detections[index], outcome, class_names, edges)
        shown = "" if drawn == len(outcome.kept) else f" ({drawn} best drawn)"
        right.set_title(f">= {threshold:.2f}: {int(outcome.true_positive.sum())} right, "
                        f"{int((~outcome.true_positive).sum())} false{shown}, {int(outcome.missed.sum())} missed",
                        fontsize=9)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def draw_truth(axis, truth: dict[str, torch.Tensor], outcome: ImageOutcome, class_names: Sequence[str],
               edges: Sequence[Edges], beside=None) -> int:
    """The non-crowd ground truth on `axis` (masks, keypoints, named boxes); the missed boxes
    dashed on `beside`. Returns the count drawn."""
    crowd = truth.get("iscrowd", torch.zeros_like(truth["labels"])).reshape(-1).bool()
    boxes, labels = truth["boxes"][~crowd].tolist(), truth["labels"][~crowd].tolist()
    if "masks" in truth:
        overlay_masks(axis, dense_masks(truth["masks"])[~crowd.numpy()], [TRUTH] * len(labels), _image_size(axis))
    if "keypoints" in truth:
        points = truth["keypoints"][~crowd].numpy()  # (N, K, 3): x, y pixels, visibility 0..2
        for instance, label in zip(points, labels):
            draw_keypoints(axis, instance[:, :2], instance[:, 2] > 0, instance[:, 2] == 1, _edges(edges, label), TRUTH)
    for box, label, missed in zip(boxes, labels, outcome.missed):
        draw_box(axis, box, TRUTH, class_name(class_names, label))
        if missed and beside is not None:
            draw_box(beside, box, MISSED, f"missed {class_name(class_names, label)}", dashed=True)
    return len(boxes)


def draw_predictions(axis, detection: dict[str, torch.Tensor], outcome: ImageOutcome, class_names: Sequence[str],
                     edges: Sequence[Edges]) -> int:
    """The detections kept at the threshold, in their outcome's colour, with their masks and the
    keypoints the model finds (probability >= KEYPOINT_SHOWN); only the MAX_DRAWN best scored of
    them (an undertrained model keeps many; they would hide the image and take seconds to draw).
    Returns the count drawn."""
    scores = detection["scores"].reshape(-1)[outcome.kept]
    best = np.sort(np.argsort(-scores.numpy(), kind="stable")[:MAX_DRAWN])  # drawn in score order's positions
    kept = outcome.kept[best].tolist()
    colours = [TRUE_POSITIVE if hit else FALSE_POSITIVE for hit in outcome.true_positive[best].tolist()]
    labels = [int(label) for label in detection["labels"].reshape(-1)[kept]]
    if "masks" in detection and kept:
        overlay_masks(axis, dense_masks(detection["masks"], kept), colours, _image_size(axis))
    if "keypoints" in detection:
        for instance, label, colour in zip(detection["keypoints"][kept].numpy(), labels, colours):
            shown = instance[:, 2] >= KEYPOINT_SHOWN
            draw_keypoints(axis, instance[:, :2], shown, np.zeros_like(shown), _edges(edges, label), colour)
    for d, label, colour in zip(kept, labels, colours):
        draw_box(axis, detection["boxes"][d].tolist(), colour,
                 f"{class_name(class_names, label)} {float(detection['scores'][d]):.2f}")
    return len(kept)


def dense_masks(masks: torch.Tensor | EncodedMasks, rows: Sequence[int] | None = None) -> np.ndarray:
    """(N, H, W) bool from dense masks or the metric's run-length encoded ones; with `rows`, only
    those masks (the others are not decoded)."""
    if not isinstance(masks, EncodedMasks):
        dense = masks.bool().numpy()
        return dense if rows is None else dense[list(rows)]
    height, width = masks.size
    runs = split_runs(masks.runs.numpy(), masks.lengths.numpy())
    runs = runs if rows is None else [runs[row] for row in rows]
    return np.stack([decode_runs(r, height, width) for r in runs]) if runs else np.zeros((0, height, width), bool)


def worst_images(detections: Sequence[dict[str, torch.Tensor]], truth: Sequence[dict[str, torch.Tensor]],
                 threshold: float, count: int) -> list[int]:
    """The `count` images with the most false positives plus misses (ties: data set order); only images with errors."""
    errors = [image_outcome(d, t, threshold).errors for d, t in zip(detections, truth, strict=True)]
    order = sorted(range(len(errors)), key=lambda i: -errors[i])
    return [i for i in order[:count] if errors[i] > 0]


def _image_size(axis) -> tuple[int, int]:
    """(H, W) of the image show_image drew on `axis` (masks stretch over it, whatever their size)."""
    left, right, bottom, top = axis.get_images()[0].get_extent()
    return int(bottom - top), int(right - left)


def _edges(edges: Sequence[Edges], label: int) -> Edges:
    return edges[label] if 0 <= label < len(edges) else ()
