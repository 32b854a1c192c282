"""Write every evaluation plot of an EvaluationResult to one folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from detrkit.analysis.confusion import confusion_matrix
from detrkit.analysis.curves import precision_recall_curves
from detrkit.analysis.gallery import plot_gallery, worst_images
from detrkit.analysis.plots import (
    plot_confidence_curves,
    plot_confusion,
    plot_precision_recall,
    plot_tide,
)
from detrkit.analysis.result import EvaluationResult

GALLERY_IMAGES = 6


def write_plots(result: EvaluationResult, folder: str | Path, threshold: float | None = None) -> EvaluationResult:
    """confusion_matrix.png, pr_curves.png, confidence_curves.png, tide.png, gallery.png and
    worst_images.png in `folder`; the confusion matrix and galleries at `threshold` (default:
    the best F1's). Returns the result with `plots` set."""
    folder = Path(folder)
    chosen = result.best_threshold if threshold is None else threshold
    names, boxes = result.class_names, [{k: d[k] for k in ("boxes", "scores", "labels")} for d in result.detections]
    matrix = confusion_matrix(boxes, result.truth, len(names), chosen)
    plots = [plot_confusion(matrix, names, chosen, folder / "confusion_matrix.png"),
             plot_precision_recall(precision_recall_curves(boxes, result.truth), names, folder / "pr_curves.png"),
             plot_confidence_curves(result.sweep, names, folder / "confidence_curves.png"),
             plot_tide(result.errors, folder / "tide.png")]
    if result.image_paths:  # boxes, and masks or keypoints where the model has them
        edges = result.keypoint_skeletons
        first = list(range(min(GALLERY_IMAGES, len(boxes))))
        plots.append(plot_gallery(result.image_paths, result.detections, result.truth, first, names, chosen,
                                  folder / "gallery.png", f"{result.split}: ground truth | predictions", edges))
        worst = worst_images(boxes, result.truth, chosen, GALLERY_IMAGES)
        plots.append(plot_gallery(result.image_paths, result.detections, result.truth, worst, names, chosen,
                                  folder / "worst_images.png", f"{result.split}: most errors first", edges))
    return dataclasses.replace(result, plots=plots)
