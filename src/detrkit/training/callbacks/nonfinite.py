"""Stop (or skip up to a budget of steps) when a training loss is NaN or infinite, naming the batch.

Lightning has no such check (its `detect_anomaly` traces every backward, far too slow to leave on).
By default the check costs no host sync in the step: each step folds "is this loss finite" into a
flag on the device and keeps the batch's image ids on the host, and the flag is read at points
that read the device anyway (every step on the CPU, every 10th step elsewhere, as often as the
progress bar reads the loss; and before validation and before the epoch's checkpoints are
written), so a non-finite step never reaches a checkpoint file. Skipping steps has to decide
before the optimizer step, so with `skip_nonfinite_steps > 0` each step reads its loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_warn

from detrkit.structures import Batch


class NonFiniteLossError(FloatingPointError):
    """A training loss was NaN or infinite; the message names the epoch, the step and the images."""


@dataclass(frozen=True)
class StepRecord:
    epoch: int
    global_step: int  # optimizer steps taken before this batch
    batch_idx: int  # the batch's index within its epoch
    image_ids: tuple[int, ...]

    def describe(self) -> str:
        return (f"epoch {self.epoch}, step {self.global_step} (batch {self.batch_idx} of the epoch), "
                f"image ids {list(self.image_ids)}")


def check_interval(device_type: str) -> int:
    """Steps between reads of the device flag: every step on the CPU (a read costs nothing there), else every 10th."""
    return 1 if device_type == "cpu" else 10


class NonFiniteLossGuard(pl.Callback):
    """Raises NonFiniteLossError for a NaN or infinite training loss, or skips the step (with a
    warning) for the first `skip_steps` of them. The module calls `admit` with each step's loss."""

    def __init__(self, skip_steps: int = 0) -> None:
        self.skip_steps = skip_steps
        self.skipped = 0
        self._first_bad: torch.Tensor | None = None  # () int64 on the device: index of the first bad batch, -1 none
        self._pending: list[StepRecord] = []  # batches since the last check, in order
        self._check_every = 1

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._check_every = check_interval(trainer.strategy.root_device.type)

    def admit(self, loss: torch.Tensor, batch: Batch, trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether to back-propagate this step's `loss`; False skips it (a budget step)."""
        record = StepRecord(trainer.current_epoch, trainer.global_step, batch_idx,
                            tuple(int(target.image_id) for target in batch.targets))
        bad = loss.detach().isfinite().logical_not()
        if self.skip_steps == 0:  # no sync: remembered on the device, read at the next check
            index = len(self._pending)
            self._pending.append(record)
            if self._first_bad is None:
                self._first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._first_bad = torch.where(bad & (self._first_bad < 0), index, self._first_bad)
            return True
        if not _on_any_process(bad, trainer):  # every process skips together: DDP's all-reduce stays paired
            return True
        self.skipped += 1
        if self.skipped > self.skip_steps:
            raise NonFiniteLossError(_message(loss, record) + f"; that is more than "
                                     f"skip_nonfinite_steps={self.skip_steps}")
        rank_zero_warn(f"{_message(loss, record)}: skipping this step ({self.skipped} of "
                       f"skip_nonfinite_steps={self.skip_steps})")
        return False

    def check(self, trainer: pl.Trainer) -> None:
        """Read the device flag; raise for the first non-finite batch since the last check."""
        if self._first_bad is None:
            return
        index = int(self._first_bad)
        pending, self._pending, self._first_bad = self._pending, [], None
        if trainer.world_size > 1:  # all processes stop together, none waits in an all-reduce
            flag = torch.tensor(int(index >= 0), device=trainer.strategy.root_device)
            if not bool(_on_any_process(flag.bool(), trainer)):
                return
        elif index < 0:
            return
        where = pending[index].describe() if index >= 0 else "a batch of another process"
        raise NonFiniteLossError(f"non-finite training loss at {where}. Nothing after the last checkpoint was "
                                 f"saved; lower lr, check those images, or pass skip_nonfinite_steps=N to skip "
                                 f"up to N such steps")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if len(self._pending) >= self._check_every:
            self.check(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(trainer)  # runs before the checkpoint callbacks write the epoch's files

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))


def _on_any_process(flag: torch.Tensor, trainer: pl.Trainer) -> bool:
    if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
        flag = flag.to(torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)


def _message(loss: torch.Tensor, record: StepRecord) -> str:
    return f"non-finite training loss ({float(loss.detach())}) at {record.describe()}"
