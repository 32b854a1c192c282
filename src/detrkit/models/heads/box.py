"""Class and box heads of the detector, their initialisation and class-count resizing."""

from __future__ import annotations

import math

import torch
from torch import nn

from detrkit.models.mlp import MLP
from detrkit.ops.linear import Linear

PRIOR_PROBABILITY = 0.01


def build_class_head(dim: int, num_logits: int) -> nn.Linear:
    """Linear head whose bias starts every class at a 1% prior probability."""
    head = Linear(dim, num_logits)
    nn.init.constant_(head.bias, -math.log((1 - PRIOR_PROBABILITY) / PRIOR_PROBABILITY))
    return head


def build_box_head(dim: int) -> MLP:
    """3-layer MLP predicting box deltas; zero last layer so boxes start at their references."""
    head = MLP(dim, dim, 4, 3)
    nn.init.zeros_(head.layers[-1].weight)
    nn.init.zeros_(head.layers[-1].bias)
    return head


def tile_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """Repeat `tensor` along dim 0 until it has at least `rows` rows, then keep the first `rows`."""
    repeats = -(-rows // tensor.shape[0])
    return tensor.repeat(repeats, *([1] * (tensor.dim() - 1)))[:rows].clone()


def resize_class_head(head: nn.Linear, num_logits: int) -> nn.Linear:
    """A new head with `num_logits` outputs whose rows are the old rows tiled then truncated."""
    resized = Linear(head.in_features, num_logits).to(head.weight.device, head.weight.dtype)
    with torch.no_grad():
        resized.weight.copy_(tile_rows(head.weight, num_logits))
        resized.bias.copy_(tile_rows(head.bias, num_logits))
    resized.weight.requires_grad_(head.weight.requires_grad)
    resized.bias.requires_grad_(head.bias.requires_grad)
    return resized
