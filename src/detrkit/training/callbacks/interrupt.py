"""Ctrl-C (SIGINT) ends training at the end of the current step, writes `last.ckpt` there and
says how to resume.

Lightning's own handling raises KeyboardInterrupt wherever the signal lands, possibly halfway
through an optimizer step or a checkpoint write. Here the signal only sets a flag. The step
finishes (with gradient accumulation, the window of micro-batches), every callback sees it,
and then the module calls `after_step`: it writes `last.ckpt` for that point and raises
TrainingInterrupted, which train() raises to its caller (Lightning turns a KeyboardInterrupt
into sys.exit(1); this is an ordinary exception, so a notebook or a script can catch it, and
`detrkit train` prints it and exits with 130, as a shell does for Ctrl-C). The checkpoint holds what a resume needs to go on
exactly: the loader's place in the epoch (EpochLoader), the epoch's train/* sums (EpochMeans)
and the random generators. A Ctrl-C during an epoch's last step or its validation lets the
epoch finish (validation, best weights, its checkpoints) and stops before the next one. A
second Ctrl-C interrupts at once.
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


class TrainingInterrupted(RuntimeError):
    """Training stopped on Ctrl-C between two steps; the message says how to resume."""


_RESUME = ("resume with train(..., resume='last') and the same output_dir (from the command line: the same "
           "detrkit train command with --resume last)")


def restarted_mid_epoch(trainer: pl.Trainer) -> bool:
    """Whether this fit resumed from a checkpoint written inside an epoch (not at its end);
    Lightning then skips the epoch's on_train_epoch_start hooks."""
    fit_loop = trainer.fit_loop
    batches = fit_loop.epoch_loop.batch_progress.current.ready
    return bool(getattr(fit_loop, "restarted_mid_epoch", False)) and 0 < batches < trainer.num_training_batches


class GracefulInterrupt(pl.Callback):
    """Owned by the training module (its configure_callbacks), which calls `after_step` at the
    end of its on_train_batch_end."""

    def __init__(self, train_config: Any, guard: Any = None) -> None:
        self.output_dir = Path(train_config.output_dir)
        self.writes_last = not train_config.dont_save_weights
        self.window = max(1, int(train_config.grad_accum_steps))
        self.guard = guard  # the non-finite loss guard: a pending bad step is reported, not saved
        self.requested = False
        self.stopped_at: dict[str, int] | None = None  # epoch, batch and step of the point saved
        self._previous: Any = None
        self._told = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def _agreed(self, trainer: pl.Trainer) -> bool:
        """Whether any process was interrupted; under DDP every process must ask at the same point."""
        requested = self.requested
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            flag = torch.tensor(int(requested), device=trainer.strategy.root_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            requested = bool(flag)
        return requested

    def after_step(self, trainer: pl.Trainer, batch_idx: int) -> None:
        if not self._agreed(trainer):
            return
        if trainer.is_last_batch:  # the epoch's validation and files come first; see on_train_epoch_start
            if not self._told:
                rank_zero_info("Ctrl-C: this epoch's validation and checkpoints come first, then training stops")
                self._told = True
            return
        if (batch_idx + 1) % self.window:  # partial gradients are in no checkpoint: close the window
            return
        if self.guard is not None:
            self.guard.check(trainer)
        self.stopped_at = {"epoch": trainer.current_epoch, "batch": batch_idx, "step": trainer.global_step}
        last = self.output_dir / "last.ckpt"
        if self.writes_last:
            trainer.save_checkpoint(last)
        self._stop(trainer, f"after step {trainer.global_step} (epoch {trainer.current_epoch + 1}/"
                            f"{trainer.max_epochs}, batch {batch_idx + 1}/{trainer.num_training_batches})",
                   f"{last} holds this point: {_RESUME}; the run goes on with the next batch and ends as an "
                   f"uninterrupted one would" if self.writes_last else
                   "dont_save_weights=True keeps no full checkpoint, so none was written; the .pth files hold the "
                   "weights of the last validated epoch (resuming from one starts the optimizer afresh)")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._agreed(trainer):
            return
        last = self.output_dir / "last.ckpt"
        self._stop(trainer, f"after epoch {trainer.current_epoch}/{trainer.max_epochs}",
                   f"{last} holds that epoch: {_RESUME}" if self.writes_last and last.is_file() else
                   "no full checkpoint was written (dont_save_weights=True); the .pth files hold the weights")

    def _stop(self, trainer: pl.Trainer, where: str, then: str) -> None:
        self._restore()
        message = f"training interrupted (Ctrl-C) {where}. {then}"
        rank_zero_info(message)
        raise TrainingInterrupted(message)

    def _restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
        self._previous = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()
