"""Calls the functions users register in `model.callbacks` (the rfdetr hook dictionary).

Lightning callbacks are the way to extend training; this bridge exists so that code written for
rfdetr's `model.callbacks["on_fit_epoch_end"].append(fn)` keeps working unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl

HOOK_EVENTS = ("on_fit_epoch_end", "on_train_batch_start", "on_train_end")


def check_hooks(hooks: Mapping[str, list[Callable[..., Any]]]) -> None:
    """Unknown event names and entries that are not callable fail before training starts."""
    for event, functions in hooks.items():
        if event not in HOOK_EVENTS:
            raise ValueError(f"model.callbacks[{event!r}]: unknown event; detrkit calls {list(HOOK_EVENTS)}")
        for function in functions:
            if not callable(function):
                raise TypeError(f"model.callbacks[{event!r}] holds {function!r}, which is not callable")


class UserHooks(pl.Callback):
    """Calls, on the main process:

    - `on_train_batch_start({"step": optimizer steps so far, "model": the detector, "epoch": epoch})`
      before every training batch;
    - `on_fit_epoch_end(stats)` after each epoch's training and validation, where `stats` holds
      every logged number by its detrkit name ("train/loss", "val/mAP_50_95", ...), "epoch"
      (0-based), "n_parameters", and rfdetr's names: "train_loss", "test_loss" (the validation
      loss, computed for these hooks unless compute_val_loss=False), "test_coco_eval_bbox" (COCOeval's twelve summary numbers: AP, AP50, AP75,
      AP small/medium/large, AR 1/10/max detections, AR small/medium/large) and, when the weights'
      moving average is scored beside the live weights, "ema_test_coco_eval_bbox";
    - `on_train_end()` once training is over.
    """

    def __init__(self, hooks: Mapping[str, list[Callable[..., Any]]]) -> None:
        check_hooks(hooks)
        self.hooks = hooks
        # rfdetr hands epoch hooks the validation loss: with compute_val_loss="auto" it is computed for them
        self.monitor = "val/loss" if hooks.get("on_fit_epoch_end") else None

    def _call(self, trainer: pl.Trainer, event: str, *args: Any) -> None:
        if trainer.is_global_zero:
            for function in self.hooks.get(event, ()):
                function(*args)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.hooks.get("on_train_batch_start"):
            self._call(trainer, "on_train_batch_start",
                       {"step": trainer.global_step, "model": pl_module.model, "epoch": trainer.current_epoch})

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.hooks.get("on_fit_epoch_end"):
            self._call(trainer, "on_fit_epoch_end", epoch_stats(trainer, pl_module))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._call(trainer, "on_train_end")


def epoch_stats(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
    """The numbers of the epoch that just ended, by detrkit's and by rfdetr's names."""
    stats: dict[str, Any] = {name: float(value) for name, value in trainer.callback_metrics.items()
                             if value.numel() == 1}
    stats["epoch"] = trainer.current_epoch
    stats["n_parameters"] = sum(p.numel() for p in pl_module.model.parameters() if p.requires_grad)
    for ours, theirs in (("train/loss", "train_loss"), ("val/loss", "test_loss")):
        if ours in stats:
            stats[theirs] = stats[ours]
    coco = pl_module.coco_stats  # empty when this epoch was not validated
    if "val/" in coco:
        stats["test_coco_eval_bbox"] = list(coco["val/"])
    if "val/ema_" in coco and "val/" in coco and coco["val/"] is not coco["val/ema_"]:
        stats["ema_test_coco_eval_bbox"] = list(coco["val/ema_"])
    return stats
