"""Stop (or skip up to a budget of steps) when a training loss is NaN or infinite, naming the batch.

Lightning has no such check (its `detect_anomaly` traces every backward, far too slow to leave on).
By default the check costs no host sync in the step: each step folds "is this loss finite" into a
flag on the device and keeps the batch's image ids on the host, and the flag is read at points
that read the device anyway (every step on the CPU, every 10th step elsewhere, as often as the
progress bar reads the loss; and before validation and before the epoch's checkpoints are
written), so a non-finite step never reaches a checkpoint file. Skipping steps has to decide
before the optimizer step, so with `skip_nonfinite_steps > 0` each step reads its loss.

A skipped batch back-propagates `zero_loss` (zeros to every weight, so that DDP's gradient
all-reduce runs on every process as usual), and an optimizer step whose batches were all skipped
finds no gradient: AdamW then leaves every weight and moment as it was. Under DDP every decision
is reduced over the processes, so all of them skip or stop together, and the message names the
process that had the non-finite loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn
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
        self.admitted = True  # whether the batch last given to `admit` back-propagates its own loss
        self._stepping = False  # a batch since the last optimizer step back-propagated its loss

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._check_every = check_interval(trainer.strategy.root_device.type)

    def admit(self, loss: torch.Tensor, batch: Batch, trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether to back-propagate this step's `loss`; False skips it (a budget step): back-propagate
        `zero_loss` instead."""
        record = StepRecord(trainer.current_epoch, trainer.global_step, batch_idx,
                            tuple(int(target.image_id) for target in batch.targets))
        bad = loss.detach().isfinite().logical_not()
        self.admitted = True
        if self.skip_steps == 0:  # no sync: remembered on the device, read at the next check
            index = len(self._pending)
            self._pending.append(record)
            if self._first_bad is None:
                self._first_bad = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._first_bad = torch.where(bad & (self._first_bad < 0), index, self._first_bad)
            return True
        # every process skips together: DDP's all-reduce stays paired
        reports = _reports(trainer, f"({float(loss.detach())}) at {record.describe()}" if bool(bad) else None)
        if not reports:
            self._stepping = True
            return True
        self.skipped += 1
        self.admitted = False
        where = "; ".join(reports)
        if self.skipped > self.skip_steps:
            raise NonFiniteLossError(f"non-finite training loss {where}; that is more than "
                                     f"skip_nonfinite_steps={self.skip_steps}")
        rank_zero_warn(f"non-finite training loss {where}: skipping this step ({self.skipped} of "
                       f"skip_nonfinite_steps={self.skip_steps})")
        return False

    def check(self, trainer: pl.Trainer) -> None:
        """Read the device flag; raise for the first non-finite batch since the last check (on any process)."""
        if self._first_bad is None:
            return
        index = int(self._first_bad)
        pending, self._pending, self._first_bad = self._pending, [], None
        reports = _reports(trainer, pending[index].describe() if index >= 0 else None)
        if reports:  # every process raises here: none is left waiting in an all-reduce
            raise NonFiniteLossError(f"non-finite training loss at {'; '.join(reports)}. Nothing after the last "
                                     f"checkpoint was saved; lower lr, check those images, or pass "
                                     f"skip_nonfinite_steps=N to skip up to N such steps")

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Drop the gradients of a step whose batches were all skipped (after DDP reduced them)."""
        if self.skip_steps and not self._stepping:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    parameter.grad = None
        self._stepping = False

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


def zero_loss(module: nn.Module) -> torch.Tensor:
    """0, as a loss that sends a zero gradient to every trainable weight of `module` without going
    through the step's non-finite graph (whose backward would give NaN gradients)."""
    weights = [parameter.sum() for parameter in module.parameters() if parameter.requires_grad]
    return torch.stack(weights).sum() * 0


def _reports(trainer: pl.Trainer, report: str | None) -> list[str]:
    """The reports of the processes that have one (this process's `report`, or None), in process
    order; under DDP each is suffixed with its process, and every process gets the same list."""
    if not (trainer.world_size > 1 and dist.is_available() and dist.is_initialized()):
        return [report] if report is not None else []
    flag = torch.tensor(int(report is not None), device=trainer.strategy.root_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not bool(flag):
        return []
    gathered: list[str | None] = [None] * trainer.world_size  # only after a non-finite loss: slow is fine
    dist.all_gather_object(gathered, report)
    return [f"{text} on process {rank}" for rank, text in enumerate(gathered) if text is not None]
