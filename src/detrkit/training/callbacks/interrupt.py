"""Ctrl-C (SIGINT) ends training at the end of the current step, and says how to resume.

Lightning's own handling raises KeyboardInterrupt wherever the signal lands, possibly halfway
through an optimizer step or a checkpoint write. Here the signal only sets a flag; the step
finishes, and TrainingInterrupted (a KeyboardInterrupt) is raised after it. `last.ckpt` is left
as the end of the last completed epoch, the point from which a resume is exact (a mid-epoch
checkpoint would resume with a different data order). A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C between two steps; the message says how to resume."""


class GracefulInterrupt(pl.Callback):
    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.requested = False
        self._previous: Any = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        requested = self.requested
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            flag = torch.tensor(int(requested), device=trainer.strategy.root_device)  # every process stops here
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            requested = bool(flag)
        if requested:
            self._restore()
            message = self.message(trainer, batch_idx)
            rank_zero_info(message)
            raise TrainingInterrupted(message)

    def message(self, trainer: pl.Trainer, batch_idx: int) -> str:
        last = self.output_dir / "last.ckpt"
        where = f"training interrupted (Ctrl-C) after step {trainer.global_step} (epoch {trainer.current_epoch}, " \
                f"batch {batch_idx})"
        if trainer.current_epoch == 0 or not last.is_file():
            return f"{where}; no epoch had completed, so there is no checkpoint to resume from"
        return (f"{where}. {last} holds epoch {trainer.current_epoch - 1}, the last completed one: resume with "
                f"train(..., resume='last') (same output_dir); epoch {trainer.current_epoch} then runs again from "
                f"its start and the run ends as an uninterrupted one would")

    def _restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
        self._previous = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()
