"""The per-epoch progress bars, numbered "epoch 3/50", with the whole run's remaining time beside them.

Lightning's bars count epochs from 0 and show no estimate for the run; RunClock times the steps
(after the first ones, which build kernels and fill caches) and the validations, and the bars and
the epoch summaries read its estimate.
"""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import convert_inf

WARMUP_STEPS = 2  # steps not timed: the first ones pay for compilation and cold caches


def format_duration(seconds: float) -> str:
    """45 -> "45s", 200 -> "3m20s", 3720 -> "1h02m"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class RunClock(pl.Callback):
    """Times training steps and validations of this run; `remaining(trainer)` estimates the rest."""

    def __init__(self) -> None:
        self.step_seconds: float | None = None
        self.validation_seconds: float | None = None
        self._timed_from: float | None = None
        self._timed_steps = 0
        self._batches_this_epoch = 0
        self._validation_start: float | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batches_this_epoch = 0
        self._timed_from, self._timed_steps = None, 0  # the loader's start is not a step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._batches_this_epoch += 1
        now = time.perf_counter()
        if self._timed_from is None:
            if self._batches_this_epoch >= WARMUP_STEPS or self.step_seconds is not None:
                self._timed_from = now
            return
        self._timed_steps += 1
        self.step_seconds = (now - self._timed_from) / self._timed_steps

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validation_start is not None and not trainer.sanity_checking:
            self.validation_seconds = time.perf_counter() - self._validation_start

    def remaining(self, trainer: pl.Trainer) -> float | None:
        """Seconds left in the run (steps and validations), None before the steps were timed."""
        if self.step_seconds is None or trainer.max_epochs is None:
            return None
        batches = trainer.num_training_batches if isinstance(trainer.num_training_batches, int) else 0
        epochs_after = max(0, trainer.max_epochs - trainer.current_epoch - 1)
        left = (max(0, batches - self._batches_this_epoch) + epochs_after * batches) * self.step_seconds
        if self.validation_seconds is not None:
            every = trainer.check_val_every_n_epoch or 1
            left += self.validation_seconds * (epochs_after + (not trainer.validating)) / every
        return left


def run_left(trainer: pl.Trainer) -> str | None:
    """"~3m20s" from the trainer's RunClock, or None."""
    clocks = [callback for callback in trainer.callbacks if isinstance(callback, RunClock)]
    seconds = clocks[0].remaining(trainer) if clocks else None
    return None if seconds is None else f"~{format_duration(seconds)}"


class EpochTQDMProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        # Lightning's own, with the 1-based description set before the bar is first drawn
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(convert_inf(self.total_train_batches))
        self.train_progress_bar.initial = 0
        self.train_progress_bar.set_description(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        left = run_left(trainer)
        return {**metrics, "run left": left} if left else metrics


class EpochRichProgressBar(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        description = f"epoch {current_epoch + 1}/{self.trainer.max_epochs}"
        return f"{description:{len(self.validation_description)}}"  # as wide as "Validation": no flicker

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        left = run_left(trainer)
        return {**metrics, "run left": left} if left else metrics
