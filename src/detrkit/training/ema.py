"""Exponential moving average of the detector's weights (spec 12.5), as a Lightning callback.

Update n (1-indexed) copies the live weights when n = 1, else moves the average towards them:
`ema = d_n * ema + (1 - d_n) * live` with `d_n = decay * (1 - exp(-n / tau))`. Parameters and
floating-point buffers are averaged; other buffers are copied.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from detrkit.training.accel.fp8 import ema_state_filter


class ModelEMA:
    """An averaged copy of `model` (eval mode, no gradients) and the number of updates it had."""

    def __init__(self, model: nn.Module, decay: float = 0.993, tau: float = 100.0) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay, self.tau = decay, tau
        self.updates = 0

    def decay_at(self, update: int) -> float:
        return self.decay * (1 - math.exp(-update / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        averaged, copied, live_averaged, live_copied = [], [], [], []
        live = dict(model.named_parameters())
        live.update(model.named_buffers())
        for name, tensor in self.state_tensors().items():
            source = live[name]
            if tensor.is_floating_point() and self.updates > 1:
                averaged.append(tensor)
                live_averaged.append(source.detach())
            else:
                copied.append(tensor)
                live_copied.append(source.detach())
        if averaged:
            torch._foreach_lerp_(averaged, live_averaged, 1.0 - self.decay_at(self.updates))
        if copied:
            torch._foreach_copy_(copied, live_copied)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = dict(self.module.named_parameters())
        tensors.update(self.module.named_buffers())
        return tensors

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "weights": portable_weights(self.module)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_portable_weights(self.module, state["weights"])
        self.updates = int(state["updates"])


def portable_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module.state_dict()` without what may not travel between models (Transformer Engine's
    `_extra_state`, see `ema_state_filter`)."""
    return {name: value for name, value in module.state_dict().items() if ema_state_filter(name)}


def load_portable_weights(module: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load `portable_weights` of a twin: every entry but the non-portable ones must match."""
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [name for name in missing if ema_state_filter(name)]
    if missing or unexpected:
        raise RuntimeError(f"the averaged weights do not fit the model: missing {missing}, unexpected {unexpected}")


class EMACallback(pl.Callback):
    """Keeps a ModelEMA of `pl_module.model`, updated every `update_interval` optimizer steps.

    The average is made at fit start, after Lightning has moved and converted the module, so it
    has the module's device and dtype; it is exposed as `pl_module.ema` for validation. Its state
    (weights and update count) travels in checkpoints. After training the live detector takes the
    averaged weights.
    """

    def __init__(self, decay: float = 0.993, tau: float = 100.0, update_interval: int = 1) -> None:
        self.decay, self.tau, self.update_interval = decay, tau, update_interval
        self.ema: ModelEMA | None = None
        self._pending: dict[str, Any] | None = None
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return "EMA"

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.ema = ModelEMA(pl_module.model, self.decay, self.tau)
        if self._pending is not None:
            self.ema.load_state_dict(self._pending)
            self._pending = None
        pl_module.ema = self.ema
        self._last_step = trainer.global_step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a resumed run's step counter is restored after on_fit_start: read it again, or the end of
        # the first micro-batch of an accumulation window would look like a new optimizer step
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step != self._last_step and step % self.update_interval == 0:
            self.ema.update(pl_module.model)
        self._last_step = step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.ema is not None and self.ema.updates:
            load_portable_weights(pl_module.model, portable_weights(self.ema.module))

    def state_dict(self) -> dict[str, Any]:
        if self.ema is None:
            return dict(self._pending or {})
        return self.ema.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.ema is None:
            self._pending = state_dict
        else:
            self.ema.load_state_dict(state_dict)
