"""The block printed once before the first step: what this run will do, and what in its data looks wrong.

It names the data (format, splits with image and instance counts, instances per class), the
model (parameters, weights or from scratch), the sizes it trains at, precision, devices,
effective batch, epochs and steps, and where the files go. Classes without training instances
are warned about, as is a short run from scratch (behaviour unchanged: it only says what to expect).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from detrkit.datasets.detect import DatasetSplits
from detrkit.datasets.detection import DetectionDataset
from detrkit.datasets.transforms import multi_scale_sizes
from detrkit.models.download import PUBLISHED_WEIGHTS, cache_dir

FEW_EPOCHS_FROM_SCRATCH = 50  # below this, training from random weights rarely reaches a useful mAP


def instances_per_class(dataset: DetectionDataset) -> Counter:
    """label -> boxes (crowd regions left out) over the split's images."""
    counts: Counter = Counter()
    for record in dataset.records:
        counts.update(int(label) for label in np.asarray(record.labels)[~np.asarray(record.iscrowd, dtype=bool)])
    return counts


class StartReport(pl.Callback):
    """Logs the start block from the main process when training starts (after a resume is restored)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        splits = getattr(trainer.datamodule, "splits", None)  # RFDETRDataModule's; a custom data module may have none
        splits = splits if isinstance(splits, DatasetSplits) else None
        lines = ["run:"]
        counts = data_lines(splits, lines) if splits is not None else None
        lines += model_lines(trainer, pl_module) + schedule_lines(trainer, pl_module)
        rank_zero_info("\n  ".join(lines))
        if counts is not None:
            warn_about_classes(splits.class_names, *counts)
        warn_if_short_from_scratch(trainer, pl_module)


def data_lines(splits, lines: list[str]) -> tuple[Counter, Counter]:
    """Appends the data lines; returns the training and validation instances per class."""
    named = [("train", splits.train), ("valid", splits.valid), ("test", splits.test)]
    per_split = {name: instances_per_class(split) for name, split in named if split is not None}
    root = Path(splits.train.records[0].path).parent if splits.train.records else None
    lines.append(f"data: {splits.dataset_format or 'custom'} format"
                 + (f", {splits.dataset_dir}" if splits.dataset_dir else f" (images beside {root})"))
    lines.append("splits: " + "; ".join(f"{name} {len(split)} images, {sum(per_split[name].values())} instances"
                                      for name, split in named if split is not None))
    train, valid = per_split["train"], per_split["valid"]
    lines.append(f"classes ({len(splits.class_names)}), train/valid instances: " + ", ".join(
        f"{name} {train[label]}/{valid[label]}" for label, name in enumerate(splits.class_names)))
    return train, valid


def model_lines(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[str]:
    config, train_config = pl_module.model_config, pl_module.train_config
    total = sum(p.numel() for p in pl_module.model.parameters())
    trainable = sum(p.numel() for p in pl_module.model.parameters() if p.requires_grad)
    lines = [f"model: {pl_module.model_name}, {total:,} parameters"
             + ("" if trainable == total else f" ({total - trainable:,} frozen)"),
             f"weights: {weights_source(config.pretrain_weights)}"]
    if train_config.resume:
        lines.append(f"resumed from {train_config.resume} at epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")
    lines.append(f"resolution: {scales_used(config.resolution, config.block_size, train_config.multi_scale, train_config.expanded_scales)}")
    return lines


def weights_source(pretrain_weights: str | None) -> str:
    if pretrain_weights is None:
        return "none, training from scratch (random initial weights)"
    if pretrain_weights in PUBLISHED_WEIGHTS:
        return f"pretrained, published {pretrain_weights} (cache {cache_dir()})"
    return f"pretrained, {pretrain_weights}"


def scales_used(resolution: int, block: int, multi_scale: str, expanded: bool) -> str:
    """The square sides training resizes to, and validation's."""
    if multi_scale == "off":
        return f"{resolution} px (multi-scale off); validation {resolution} px"
    sizes = multi_scale_sizes(resolution, block, expanded)
    how = "one size per step" if multi_scale == "per-batch" else "one size per image"
    return (f"{resolution} px; multi-scale {multi_scale}: {min(sizes)} to {max(sizes)} px in steps of {block} "
            f"({how}); validation {resolution} px")


def schedule_lines(trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[str]:
    config = pl_module.train_config
    processes, accumulation = trainer.world_size, config.grad_accum_steps
    batches = trainer.num_training_batches if isinstance(trainer.num_training_batches, int) else 0
    steps = math.ceil(batches / accumulation)
    device = trainer.strategy.root_device
    output = Path(config.output_dir)
    return [
        f"precision: {trainer.precision}; devices: {processes} x {device.type}"
        + (f" ({trainer.num_nodes} nodes)" if trainer.num_nodes > 1 else ""),
        (f"effective batch: {config.batch_size} per device x {accumulation} accumulation x {processes} "
         f"device{'s' if processes > 1 else ''} = {config.batch_size * accumulation * processes} images per step"),
        f"epochs: {trainer.max_epochs}, {steps} steps each, {steps * (trainer.max_epochs or 0)} steps in all"
        + (f"; validation every {trainer.check_val_every_n_epoch} epochs" if trainer.check_val_every_n_epoch > 1
           else "; validation every epoch"),
        (f"files: {output} (best weights checkpoint_best_total.pth, "
         + ("" if config.dont_save_weights else "full state for resume last.ckpt, ")
         + "metrics.csv, plots/results.png"
         + (", the first batches as augmented plots/train_batch0.png" if config.train_batch_plots else "") + ")"),
    ]


def warn_about_classes(class_names: list[str], train: Counter, valid: Counter) -> None:
    """Classes the model cannot learn: without training instances (and those seen only in validation)."""
    only_valid = [name for label, name in enumerate(class_names) if not train[label] and valid[label]]
    absent = [name for label, name in enumerate(class_names) if not train[label] and not valid[label]]
    if only_valid:
        rank_zero_warn(f"classes present only in validation, with no training instances: {', '.join(only_valid)}. "
                       f"The model cannot learn them and their AP will be 0; add training images of them.")
    if absent:
        rank_zero_warn(f"classes with no training instances (nor validation ones): {', '.join(absent)}; they "
                       f"only take output slots (remove them from the annotations if they are not needed).")


def warn_if_short_from_scratch(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    epochs = trainer.max_epochs or 0
    if pl_module.model_config.pretrain_weights is not None or pl_module.train_config.resume or \
            epochs >= FEW_EPOCHS_FROM_SCRATCH:
        return
    rank_zero_warn(
        f"training from scratch (no pretrained weights) for {epochs} epochs: expect a low mAP, often near 0 for "
        f"the first epochs, and many low-confidence duplicate boxes. What helps: pretrained weights (the default; "
        f"leave out --weights none / pretrain_weights=None), more epochs ({FEW_EPOCHS_FROM_SCRATCH} or more), a "
        f"higher learning rate (lr and lr_encoder, e.g. 4e-4). Training goes on as asked.")
