"""The optimizer over detrkit's parameter groups (encoder layer decay, component decay) and its LR schedule."""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LinearLR, ReduceLROnPlateau, SequentialLR

from detrkit.config import MANAGED_SCHEDULE_KWARGS, native_optimizer

logger = logging.getLogger(__name__)

_NO_DECAY_IN_ENCODER = ("gamma", "pos_embed", "rel_pos", "bias", "norm", "embeddings")
_ENCODER_LAYER = re.compile(r"encoder\.layer\.(\d+)\.")


def encoder_layer_id(name: str, num_layers: int) -> int:
    """0 for embeddings, k+1 for block k, num_layers+1 for what follows the blocks."""
    if "embeddings" in name:
        return 0
    match = _ENCODER_LAYER.search(name)
    return int(match.group(1)) + 1 if match else num_layers + 1


def parameter_groups(named_parameters: Iterable[tuple[str, nn.Parameter]], *, lr: float, lr_encoder: float,
                     weight_decay: float, layer_decay: float, component_decay: float,
                     num_encoder_layers: int) -> list[dict]:
    """Trainable parameters grouped by (lr, weight_decay); identical groups merged.

    Encoder (`backbone.0.encoder`): lr_encoder * layer_decay^(L + 1 - layer_id) * component_decay^2,
    no weight decay on biases, norms and embeddings. Decoder (`transformer.decoder`):
    lr * component_decay. Everything else: lr. Order: others, encoder groups, decoder.
    """
    sections: dict[str, dict[tuple[float, float], list[nn.Parameter]]] = {"other": {}, "encoder": {}, "decoder": {}}
    for name, param in named_parameters:
        if not param.requires_grad:
            continue
        if "backbone.0.encoder" in name:
            depth = num_encoder_layers + 1 - encoder_layer_id(name, num_encoder_layers)
            key = (lr_encoder * layer_decay**depth * component_decay**2,
                   0.0 if any(word in name for word in _NO_DECAY_IN_ENCODER) else weight_decay)
            section = "encoder"
        elif "transformer.decoder" in name:
            key, section = (lr * component_decay, weight_decay), "decoder"
        else:
            key, section = (lr, weight_decay), "other"
        sections[section].setdefault(key, []).append(param)
    merged: dict[tuple[float, float], list[nn.Parameter]] = {}
    for section in ("other", "encoder", "decoder"):
        for key, params in sections[section].items():
            merged.setdefault(key, []).extend(params)
    return [{"params": params, "lr": key[0], "weight_decay": key[1]} for key, params in merged.items()]


def lr_factor(schedule: str, *, total_steps: int, epochs: int, warmup_epochs: float, lr_drop: float = 100,
              min_factor: float = 0.0) -> Callable[[int], float]:
    """LR multiplier per optimizer step: linear warm-up, then a step drop (x0.1) or a cosine."""
    steps_per_epoch = max(1, total_steps // epochs)
    warmup = int(steps_per_epoch * warmup_epochs)

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if schedule == "step":
            return 1.0 if step < lr_drop * steps_per_epoch else 0.1
        progress = (step - warmup) / max(1, total_steps - warmup)
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def import_dotted(path: str, setting: str) -> Callable[..., Any]:
    """The class or factory at a dotted import path ("torch.optim.SGD"); ValueError naming the setting."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{setting}={path!r} cannot be imported ({error}); give the full import path of a "
                         f"class, e.g. 'torch.optim.SGD'") from error


def build_optimizer(named_parameters: Iterable[tuple[str, nn.Parameter]], groups_kwargs: dict,
                    fused: bool = False, optimizer: str | Callable[..., Any] = "adamw",
                    optimizer_kwargs: dict[str, Any] | None = None) -> torch.optim.Optimizer:
    """`optimizer` over detrkit's parameter groups. A torch.optim name (any case) gets lr and, when its
    constructor takes it, weight_decay, then optimizer_kwargs; fused applies to AdamW only. A dotted
    path or a callable is called as optimizer(groups, **optimizer_kwargs): each group carries its lr
    and weight_decay."""
    groups, kwargs = parameter_groups(named_parameters, **groups_kwargs), dict(optimizer_kwargs or {})
    if isinstance(optimizer, str) and "." not in optimizer:
        factory = native_optimizer(optimizer)
        if "weight_decay" in inspect.signature(factory).parameters:
            kwargs["weight_decay"] = groups_kwargs["weight_decay"]
        if factory is torch.optim.AdamW:
            kwargs["fused"] = fused or None
        kwargs["lr"] = groups_kwargs["lr"]
    else:
        factory = import_dotted(optimizer, "optimizer") if isinstance(optimizer, str) else optimizer
    try:
        return factory(groups, **kwargs)
    except (TypeError, ValueError) as error:
        raise type(error)(f"optimizer {_name(optimizer)} rejected its arguments {sorted(kwargs)}: {error}") from error


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: str | Callable[..., Any], kwargs: dict[str, Any], *,
                    total_steps: int, epochs: int, warmup_epochs: float, interval: str = "step",
                    monitor: str = "val/loss") -> dict[str, Any]:
    """Lightning's lr_scheduler entry. "step"/"cosine": a LambdaLR stepped every optimizer step (spec 12.3).
    Otherwise scheduler(optimizer, **kwargs) stepped per `interval`, after a LinearLR warm-up joined by
    SequentialLR; ReduceLROnPlateau is stepped per epoch on `monitor` and has no warm-up."""
    if isinstance(schedule, str) and schedule in ("step", "cosine"):
        factor = lr_factor(schedule, total_steps=total_steps, epochs=epochs, warmup_epochs=warmup_epochs,
                           **{**MANAGED_SCHEDULE_KWARGS, **kwargs})
        return {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, factor), "interval": "step"}
    factory = import_dotted(schedule, "lr_scheduler") if isinstance(schedule, str) else schedule
    try:
        scheduler = factory(optimizer, **kwargs)
    except (TypeError, ValueError) as error:
        raise type(error)(f"lr_scheduler {_name(schedule)} rejected lr_scheduler_kwargs {sorted(kwargs)}: "
                          f"{error}") from error
    if isinstance(scheduler, ReduceLROnPlateau):
        if warmup_epochs:
            logger.warning("warmup_epochs=%s is ignored: ReduceLROnPlateau follows its monitor", warmup_epochs)
        return {"scheduler": scheduler, "interval": "epoch", "monitor": monitor}
    warmup = (math.ceil(warmup_epochs) if interval == "epoch"
              else int(max(1, total_steps // epochs) * warmup_epochs))
    if interval == "epoch" and warmup == 1:
        raise ValueError(f"warmup_epochs={warmup_epochs} with lr_scheduler_interval='epoch' cannot ramp: an "
                         f"epoch-stepped warm-up needs at least 2 epochs")
    if warmup > 0:
        ramp = LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup)
        scheduler = SequentialLR(optimizer, [ramp, scheduler], milestones=[warmup])
    return {"scheduler": scheduler, "interval": interval}


def _name(setting: str | Callable[..., Any]) -> str:
    target = setting.func if isinstance(setting, functools.partial) else setting
    return repr(setting) if isinstance(setting, str) else getattr(target, "__qualname__", repr(target))
