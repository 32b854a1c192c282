"""AdamW parameter groups (encoder layer decay, component decay) and the managed LR schedules."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

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


def build_optimizer(named_parameters: Iterable[tuple[str, nn.Parameter]], groups_kwargs: dict,
                    fused: bool = False) -> torch.optim.AdamW:
    groups = parameter_groups(named_parameters, **groups_kwargs)
    return torch.optim.AdamW(groups, lr=groups_kwargs["lr"], weight_decay=groups_kwargs["weight_decay"],
                             fused=fused or None)
