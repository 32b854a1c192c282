"""Multi-scale deformable cross-attention module with box-relative sampling offsets."""

from __future__ import annotations

import math

import torch
from torch import nn

from detrkit.ops.deformable import SAMPLERS, deformable_sample
from detrkit.ops.linear import Linear


class MSDeformAttn(nn.Module):
    sampling = "grid_sample"  # a detrkit.ops.deformable.SAMPLERS name; export may choose "gather"

    def __init__(self, dim: int, levels: int, heads: int, points: int) -> None:
        super().__init__()
        self.levels, self.heads, self.points = levels, heads, points
        self.sampling_offsets = Linear(dim, heads * levels * points * 2)
        self.attention_weights = Linear(dim, heads * levels * points)
        self.value_proj = Linear(dim, dim)
        self.output_proj = Linear(dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Offsets start on a ring of head directions, scaled by point index; uniform attention."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.heads, dtype=torch.float32) * (2.0 * math.pi / self.heads)
        directions = torch.stack((angles.cos(), angles.sin()), -1)
        directions = directions / directions.abs().max(-1, keepdim=True).values
        steps = torch.arange(1, self.points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        bias = directions.view(self.heads, 1, 1, 2).repeat(1, self.levels, self.points, 1) * steps
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(bias.flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], padding: torch.Tensor | None) -> torch.Tensor:
        """query (B, Lq, D); reference (B, Lq, levels, 4) cxcywh; memory (B, Len, D);
        padding (B, Len) True where padded, or None."""
        batch, queries, dim = query.shape
        value = self.value_proj(memory)
        if padding is not None:
            value = value.masked_fill(padding[..., None], 0.0)
        value = value.view(batch, -1, self.heads, dim // self.heads)
        offsets = self.sampling_offsets(query).view(batch, queries, self.heads, self.levels, self.points, 2)
        weights = self.attention_weights(query).view(batch, queries, self.heads, self.levels * self.points)
        weights = weights.softmax(-1).view(batch, queries, self.heads, self.levels, self.points)
        # (B, Lq, 1, levels, 1, 2) boxes: offsets are in units of half the box size per point
        ref_xy = reference[:, :, None, :, None, :2]
        ref_wh = reference[:, :, None, :, None, 2:]
        locations = ref_xy + offsets / self.points * ref_wh * 0.5
        return self.output_proj(deformable_sample(value, shapes, locations, weights,
                                                    SAMPLERS[self.sampling]))
