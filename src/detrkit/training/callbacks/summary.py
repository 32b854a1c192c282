"""One line per epoch with the main numbers and the run's remaining time; Lightning's progress bar leaves none behind."""

from __future__ import annotations

import time

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info

from detrkit.training.callbacks.progress import run_left

_SHOWN = (("train/loss", "loss"), ("val/mAP_50_95", "mAP50-95"), ("val/mAP_50", "mAP50"),
          ("val/segm_mAP_50_95", "mask mAP50-95"), ("val/segm_mAP_50", "mask mAP50"),
          ("val/keypoint_map_50_95", "keypoint mAP50-95"), ("val/mAR", "mAR"),
          ("val/F1", "F1"))


class EpochSummary(pl.Callback):
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = trainer.callback_metrics
        parts = [f"{label} {float(metrics[key]):.4f}" for key, label in _SHOWN if key in metrics]
        seconds = time.perf_counter() - getattr(self, "_start", time.perf_counter())
        left = run_left(trainer) if trainer.current_epoch + 1 < (trainer.max_epochs or 0) else None
        rank_zero_info(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: {', '.join(parts)} "
                       f"({seconds:.1f} s{f'; run left {left}' if left else ''})")
