"""Multi-scale deformable attention sampling in pure PyTorch (bilinear grid_sample per level)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def deformable_sample(value: torch.Tensor, shapes: list[tuple[int, int]], locations: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """Attention-weighted bilinear samples of `value` at `locations`.

    value:     (B, Len, heads, head_dim), levels flattened row-major one after another
    locations: (B, Lq, heads, levels, points, 2) in [0, 1] (x, y) image-relative coordinates
    weights:   (B, Lq, heads, levels, points), summing to 1 over (levels, points)
    returns    (B, Lq, heads * head_dim)
    """
    batch, _, heads, head_dim = value.shape
    _, queries, _, levels, points, _ = locations.shape
    grids = 2 * locations - 1
    sampled = []
    start = 0
    for level, (height, width) in enumerate(shapes):
        # (B, h*w, heads, d) -> (B*heads, d, h, w)
        level_value = value[:, start:start + height * width].permute(0, 2, 3, 1)
        level_value = level_value.reshape(batch * heads, head_dim, height, width)
        # (B, Lq, heads, P, 2) -> (B*heads, Lq, P, 2)
        grid = grids[:, :, :, level].transpose(1, 2).reshape(batch * heads, queries, points, 2)
        sampled.append(F.grid_sample(level_value, grid, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))  # (B*heads, d, Lq, P)
        start += height * width
    stacked = torch.stack(sampled, dim=-2).flatten(-2)  # (B*heads, d, Lq, levels*P)
    attn = weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    out = (stacked * attn).sum(-1)  # (B*heads, d, Lq)
    return out.view(batch, heads * head_dim, queries).transpose(1, 2)
