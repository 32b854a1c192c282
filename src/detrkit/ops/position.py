"""Sinusoidal embeddings of box coordinates for decoder query positions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


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


def resize_grid_embeddings(table: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(g*g, C) row-major square grid of embeddings -> (rows*cols, C), bicubic with antialias
    (off on MPS, which lacks it), computed in float32 and cast back."""
    grid = round(table.shape[0] ** 0.5)
    square = table.float().reshape(1, grid, grid, -1).permute(0, 3, 1, 2)  # (1, C, grid, grid)
    resized = F.interpolate(square, size=(rows, cols), mode="bicubic", align_corners=False,
                            antialias=table.device.type != "mps")
    return resized.to(table.dtype).permute(0, 2, 3, 1).reshape(rows * cols, -1)
