"""Backbone: the ViT's tapped maps fused by the projector into pyramid levels with padding masks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.models.projector import MultiScaleProjector
from detrkit.models.vit import DinoV2


@dataclass
class Features:
    levels: list[torch.Tensor]  # (B, D, h, w) pyramid levels
    masks: list[torch.Tensor] | None  # (B, h, w) True on padded cells; None without padding
    keypoint_levels: list[torch.Tensor] | None = None  # the second projector's levels, same sizes


class Backbone(nn.Module):
    """The encoder and its projector; a second projector, when given, fuses the same ViT maps
    separately for keypoint cross-attention (dual projector)."""

    def __init__(self, encoder: DinoV2, projector: MultiScaleProjector,
                 cross_attn_projector: MultiScaleProjector | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector
        self.cross_attn_projector = cross_attn_projector

    def forward(self, pixels: torch.Tensor, padding: torch.Tensor | None = None) -> Features:
        """pixels (B, C, H, W); padding (B, H, W) True on padded pixels, or None."""
        maps = self.encoder(pixels)
        levels = self.projector(maps)
        second = None if self.cross_attn_projector is None else self.cross_attn_projector(maps)
        if padding is None:
            return Features(levels, None, second)
        masks = [F.interpolate(padding[:, None].float(), size=level.shape[-2:]).to(torch.bool)[:, 0]
                 for level in levels]
        return Features(levels, masks, second)
