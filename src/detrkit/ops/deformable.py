"""Multi-scale deformable attention sampling in pure PyTorch (bilinear sampling per level)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Sampler = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def grid_sample_bilinear(image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """image (N, C, H, W) at grid (N, Hg, Wg, 2) in [-1, 1] (x, y) -> (N, C, Hg, Wg); zeros outside."""
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def gather_bilinear(image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """grid_sample_bilinear from floor, gather and arithmetic only: for runtimes without GridSample
    (it exports as ONNX GatherElements). Same numbers up to float rounding."""
    batch, channels, height, width = image.shape
    x = ((grid[..., 0] + 1) * width - 1) / 2  # (N, Hg, Wg) pixel coordinates, centres at integers
    y = ((grid[..., 1] + 1) * height - 1) / 2
    x0, y0 = x.floor(), y.floor()
    flat = image.flatten(2)  # (N, C, H*W)
    out = torch.zeros(batch, channels, *grid.shape[1:3], dtype=image.dtype, device=image.device)
    for dy, weight_y in ((0, 1 - (y - y0)), (1, y - y0)):
        for dx, weight_x in ((0, 1 - (x - x0)), (1, x - x0)):
            column, row = x0 + dx, y0 + dy
            inside = (column >= 0) & (column <= width - 1) & (row >= 0) & (row <= height - 1)
            index = (row.clamp(0, height - 1) * width + column.clamp(0, width - 1)).long().flatten(1)
            corner = flat.gather(2, index[:, None].expand(-1, channels, -1)).view_as(out)
            out = out + corner * (weight_x * weight_y * inside)[:, None]
    return out


SAMPLERS: dict[str, Sampler] = {"grid_sample": grid_sample_bilinear, "gather": gather_bilinear}


def deformable_sample(value: torch.Tensor, shapes: list[tuple[int, int]], locations: torch.Tensor,
                      weights: torch.Tensor, sampler: Sampler = grid_sample_bilinear) -> torch.Tensor:
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
        sampled.append(sampler(level_value, grid))  # (B*heads, d, Lq, P)
        start += height * width
    stacked = torch.stack(sampled, dim=-2).flatten(-2)  # (B*heads, d, Lq, levels*P)
    attn = weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    out = (stacked * attn).sum(-1)  # (B*heads, d, Lq)
    return out.view(batch, heads * head_dim, queries).transpose(1, 2)
