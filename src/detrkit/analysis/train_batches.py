"""Batches as the model sees them, drawn: the first training batches (augmented) to plots/train_batch<i>.png,
and with save_dataset_grids the first batch of each split to dataset_grids/."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytorch_lightning as pl
import torch

from detrkit.analysis.drawing import (
    Edges,
    class_colour,
    class_name,
    draw_box,
    draw_keypoints,
    drawing_step,
    overlay_masks,
    show_image,
)
from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.datasets.keypoint_schema import KeypointSchema
from detrkit.ops.boxes import cxcywh_to_xyxy
from detrkit.structures import Batch, Target

TRAIN_BATCHES = 2  # train_batch0.png, train_batch1.png
MAX_IMAGES = 16  # drawn per batch
COLUMNS = 4


@dataclass(frozen=True)
class PixelTarget:
    """A Target in the pixels of its transformed image: boxes (N, 4) xyxy, keypoints (N, K, 3) x, y, v."""

    boxes: np.ndarray
    labels: np.ndarray
    masks: np.ndarray | None  # (N, h, w) bool
    keypoints: np.ndarray | None


def pixel_target(target: Target) -> PixelTarget:
    """Normalised cxcywh boxes and keypoints scaled by the transformed image's size (target.size)."""
    height, width = target.size
    boxes = cxcywh_to_xyxy(target.boxes.detach().float().cpu()) * torch.tensor([width, height, width, height])
    keypoints = None
    if target.keypoints is not None:
        keypoints = (target.keypoints.detach().float().cpu() * torch.tensor([width, height, 1.0])).numpy()
    masks = None if target.masks is None else target.masks.detach().cpu().bool().numpy()
    return PixelTarget(boxes.numpy(), target.labels.detach().cpu().numpy(), masks, keypoints)


def batch_images(pixels: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) pixels normalised as training normalises them -> (B, H, W, 3) uint8 RGB (the
    first three channels; one channel is shown grey)."""
    channels = pixels.shape[1]
    mean = torch.tensor([IMAGENET_MEAN[i % 3] for i in range(channels)]).view(1, -1, 1, 1)
    std = torch.tensor([IMAGENET_STD[i % 3] for i in range(channels)]).view(1, -1, 1, 1)
    rgb = pixels.detach().float().cpu() * std + mean
    rgb = rgb[:, :3] if channels >= 3 else rgb[:, :1].expand(-1, 3, -1, -1)
    return rgb.clamp(0, 1).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def draw_sample(axis, image: np.ndarray, target: PixelTarget, class_names: Sequence[str],
                edges: Sequence[Edges]) -> None:
    """One image with its boxes and class names, masks tinted and keypoints (solid visible, rings
    occluded) with their class's skeleton, each object in its class's colour."""
    size = image.shape[:2]
    step = drawing_step(size)
    show_image(axis, image[::step, ::step], size)
    colours = [class_colour(int(label)) for label in target.labels]
    if target.masks is not None:
        overlay_masks(axis, target.masks, colours, size)
    for index, (box, label) in enumerate(zip(target.boxes.tolist(), target.labels.tolist())):
        draw_box(axis, box, colours[index], class_name(class_names, label))
        if target.keypoints is not None:
            points = target.keypoints[index]  # (K, 3)
            draw_keypoints(axis, points[:, :2], points[:, 2] > 0, points[:, 2] == 1,
                           edges[label] if label < len(edges) else (), colours[index])


def plot_train_batch(batch: Batch, class_names: Sequence[str], edges: Sequence[Edges], path: Path,
                     title: str) -> Path:
    """Up to MAX_IMAGES images of `batch`, each cropped to its content (padding left out), in a grid."""
    count = min(len(batch), MAX_IMAGES)
    images = batch_images(batch.pixels[:count])
    columns = min(COLUMNS, count)
    rows = math.ceil(count / columns)
    # a fixed layout: matplotlib's constrained one takes seconds on a grid of labelled images
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.4 * rows + 0.4), squeeze=False,
                                gridspec_kw={"left": 0.01, "right": 0.99, "bottom": 0.01, "wspace": 0.04,
                                             "top": 1 - 0.45 / (3.4 * rows + 0.4), "hspace": 0.12})
    for axis in axes.flat:
        axis.set_axis_off()
    for index, (axis, target) in enumerate(zip(axes.flat, batch.targets[:count])):
        height, width = target.size
        drawn = pixel_target(target)
        draw_sample(axis, images[index, :height, :width], drawn, class_names, edges)
        count_text = f"{len(drawn.labels)} object{'' if len(drawn.labels) == 1 else 's'}"
        axis.set_title(f"image {target.image_id}: {count_text}, {width}x{height}", fontsize=8)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


class TrainBatchPlots(pl.Callback):
    """Draws the first TRAIN_BATCHES batches of a run's first epoch after their step, on the main
    process, as the step received them (augmented; before a per-batch multi-scale resize). A
    resumed run past epoch 0 draws nothing. Lightning has no such plot, hence a callback."""

    def __init__(self, folder: Path, class_names: Sequence[str], keypoint_schema: KeypointSchema | None) -> None:
        self.folder, self.class_names, self.edges = Path(folder), list(class_names), (
            keypoint_schema.edges if keypoint_schema is not None else [])
        self.written: list[Path] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch: Batch,
                           batch_idx: int) -> None:
        if trainer.current_epoch != 0 or batch_idx >= TRAIN_BATCHES or not trainer.is_global_zero:
            return
        path = self.folder / f"train_batch{batch_idx}.png"
        self.written.append(plot_train_batch(batch, self.class_names, self.edges, path,
                                             f"training batch {batch_idx} after augmentation"))


class DatasetGrids(pl.Callback):
    """save_dataset_grids=True: the first training batch (augmented) and the first validation
    batch (evaluation transform) of a fresh run, drawn to dataset_grids/train_grid.png and
    valid_grid.png on the main process; the validation grid comes from the first validation
    that is not Lightning's sanity check."""

    def __init__(self, folder: Path, class_names: Sequence[str], keypoint_schema: KeypointSchema | None) -> None:
        self.folder, self.class_names, self.edges = Path(folder), list(class_names), (
            keypoint_schema.edges if keypoint_schema is not None else [])
        self.written: list[Path] = []

    def _draw(self, trainer: pl.Trainer, batch: Batch, split: str, what: str) -> None:
        path = self.folder / f"{split}_grid.png"
        if trainer.current_epoch == 0 and trainer.is_global_zero and path not in self.written:
            self.written.append(plot_train_batch(batch, self.class_names, self.edges, path,
                                                 f"{split} split: first batch, {what}"))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch: Batch,
                           batch_idx: int) -> None:
        if batch_idx == 0:
            self._draw(trainer, batch, "train", "after augmentation")

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch: Batch,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx == 0 and not trainer.sanity_checking:
            self._draw(trainer, batch, "valid", "evaluation transform")


def batch_plot_callbacks(plots: bool, grids: bool, output_dir: str | Path, class_names: Sequence[str],
                         keypoint_schema: KeypointSchema | None) -> list[pl.Callback]:
    """The callbacks that train_batch_plots (plots/) and save_dataset_grids (dataset_grids/) ask for."""
    folder = Path(output_dir)
    return ([TrainBatchPlots(folder / "plots", class_names, keypoint_schema)] if plots else []) + (
        [DatasetGrids(folder / "dataset_grids", class_names, keypoint_schema)] if grids else [])
