"""Manual optimisation of keypoint models: one clipped optimizer step per window of micro-batches
whose gradient is normalised by the window's box count (spec 7.7, 12.3-12.4).

Lightning's automatic accumulation would divide each micro-batch's loss by that micro-batch's own
box count. Here every micro-batch's loss numerator is divided by the running count of its window
(all-reduced over processes), and the gradients accumulated before it are rescaled by old / new
count, so a window trains as one batch of all its images on all processes. Under DDP only the
backward that closes the window reduces gradients. Lightning neither clips, accumulates nor steps
LR schedulers under manual optimisation, so this module does those three things, and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch

from detrkit.config import KeypointTrainConfig, TrainConfig
from detrkit.losses.accumulation import BoxCountNormaliser, rescale_gradients
from detrkit.losses.criterion import LossOutput, SetCriterion, num_boxes_normaliser
from detrkit.structures import DetectorOutput, Target
from detrkit.training.accel.plan import SHARDED_STRATEGIES
from detrkit.training.callbacks.nonfinite import zero_loss

if TYPE_CHECKING:
    from detrkit.training.module import RFDETRModelModule


def trains_manually(train_config: TrainConfig) -> bool:
    """Keypoint training (KeypointTrainConfig) optimises manually; detection and segmentation do not."""
    return isinstance(train_config, KeypointTrainConfig)


def require_data_parallel(strategy: Any) -> None:
    """ValueError for a sharded strategy (FSDP, DeepSpeed; a name or a Strategy object): manual
    accumulation relies on DDP's no_sync and on every process holding whole gradients."""
    name = (strategy if isinstance(strategy, str) else type(strategy).__name__).lower()
    if any(sharded in name for sharded in SHARDED_STRATEGIES):
        shown = strategy if isinstance(strategy, str) else type(strategy).__name__
        raise ValueError(f"keypoint models do not train with the sharded strategy {shown!r} (FSDP and DeepSpeed "
                         f"are not supported): use strategy='ddp', or 'auto' with devices > 1")


class ManualAccumulation:
    """Backward of each micro-batch and the optimizer step of each window of `accumulation`.

    Windows follow the batch index within the epoch: batch i opens one when i % accumulation == 0
    and closes it when (i + 1) % accumulation == 0 or it is the epoch's last batch. So an epoch,
    also one repeated after a resume, always has the same windows.
    """

    def __init__(self, accumulation: int) -> None:
        self.accumulation = accumulation
        self.normaliser = BoxCountNormaliser()

    def __call__(self, module: RFDETRModelModule, criterion: SetCriterion, outputs: DetectorOutput,
                 targets: list[Target], groups: int, image_size: tuple[int, int], batch_idx: int,
                 admit: Callable[[torch.Tensor], bool] | None = None) -> LossOutput:
        """Back-propagate one micro-batch, and step when it closes its window. Returns its losses
        over its own box count, detached: what an automatic step would log for it. `admit(loss)`
        False leaves the micro-batch out of its window (a zero gradient, no box count)."""
        count = num_boxes_normaliser(targets, groups, outputs.pred_logits.device)  # the same on every process
        numerators = criterion(outputs, targets, groups=groups, image_size=image_size,
                               num_boxes=torch.ones_like(count))
        if batch_idx % self.accumulation == 0:
            self.normaliser.reset()
        closes = self.closes(batch_idx, module.trainer.num_training_batches)
        optimizer = module.optimizers()
        if admit is None or admit(numerators.total):
            scales = self.normaliser.scales(count)
            rescale_gradients(module.parameters(), scales.gradients)
            loss = numerators.total / scales.denominator
        else:  # a skipped micro-batch: zeros, so that DDP's all-reduce stays paired
            loss = zero_loss(module)
        with optimizer.toggle_model(sync_grad=closes):  # DDP's no_sync for the backwards that do not close
            module.manual_backward(loss)
        if closes:
            optimizer.step()  # clipping runs in on_before_optimizer_step, after unscaling
            optimizer.zero_grad()
            self.normaliser.reset()
            step_schedulers(module, "step")
        return LossOutput(numerators.total.detach() / count,
                          {name: term.detach() / count for name, term in numerators.terms.items()},
                          numerators.class_error, numerators.cardinality_error)

    def closes(self, batch_idx: int, num_batches: float) -> bool:
        return (batch_idx + 1) % self.accumulation == 0 or batch_idx + 1 == num_batches

    def optimizer_steps(self, trainer: pl.Trainer) -> int:
        """Optimizer steps of the run (the schedule's length): ceil(batches / accumulation) per
        epoch. The Trainer counts micro-batches, as it accumulates nothing itself here."""
        estimate = trainer.estimated_stepping_batches  # also loads the training data
        if trainer.max_epochs is None or trainer.max_epochs < 0 or math.isinf(trainer.num_training_batches):
            return int(estimate)  # max_steps bounds the run
        steps = math.ceil(trainer.num_training_batches / self.accumulation) * trainer.max_epochs
        return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps


def step_schedulers(module: pl.LightningModule, interval: str) -> None:
    """Step the LR schedulers of `interval` as Lightning's loop does under automatic optimisation:
    "step" ones after each optimizer step, "epoch" ones (ReduceLROnPlateau on its monitor) once an
    epoch, each every `frequency` of them."""
    trainer = module.trainer
    count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
    for config in trainer.lr_scheduler_configs:
        if config.interval != interval or count % config.frequency:
            continue
        metric = None
        if config.reduce_on_plateau:
            metric = trainer.callback_metrics.get(config.monitor)
            if metric is None:
                if config.strict:
                    raise ValueError(f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; "
                                     f"logged: {sorted(trainer.callback_metrics)}")
                continue  # no validation this epoch
        module.lr_scheduler_step(config.scheduler, metric)
