"""Backbone: the ViT's tapped maps fused by the projector into pyramid levels with padding masks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.models.projector import MultiScaleProjector
from detrkit.models.vit import DinoV2


class Backbone(nn.Module):
    def __init__(self, encoder: DinoV2, projector: MultiScaleProjector) -> None:
        super().__init__()
        self.encoder = encoder
        self.projector = projector

    def forward(self, pixels: torch.Tensor, padding: torch.Tensor | None = None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """pixels (B, C, H, W); padding (B, H, W) True on padded pixels, or None.

        Returns the (B, D, h, w) levels and their (B, h, w) padding masks (None without padding).
        """
        levels = self.projector(self.encoder(pixels))
        if padding is None:
            return levels, None
        masks = [F.interpolate(padding[:, None].float(), size=level.shape[-2:]).to(torch.bool)[:, 0]
                 for level in levels]
        return levels, masks
