"""Sinusoidal embeddings of box coordinates for decoder query positions."""

from __future__ import annotations

import math

import torch


def box_sine_embedding(boxes: torch.Tensor, num_feats: int = 128, temperature: float = 10000.0) -> torch.Tensor:
    """(..., 4) cxcywh boxes -> (..., 4 * num_feats) features, coordinate order (cy, cx, w, h).

    Feature i of coordinate v is sin(v * 2pi / t_i) for even i and cos(...) for odd i, with
    t_i = temperature ** (2 * (i // 2) / num_feats).
    """
    index = torch.arange(num_feats, dtype=torch.float32, device=boxes.device)
    periods = temperature ** (2 * torch.div(index, 2, rounding_mode="floor") / num_feats)
    coords = boxes[..., [1, 0, 2, 3]].to(torch.float32) * (2 * math.pi)
    angles = coords.unsqueeze(-1) / periods  # (..., 4, num_feats)
    features = torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=-1)
    return features.flatten(-3).to(boxes.dtype)  # (..., 4 * num_feats)
