"""Segmentation head: per-query mask logits from decoder queries and upsampled pixel features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.ops.linear import Linear, PackedWeight, linear
from detrkit.structures import MaskFactors


class DepthwiseConvBlock(nn.Module):
    """x + GELU(Linear(LayerNorm(depthwise 3x3 conv(x)))), norm and linear applied channels-last."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = Linear(dim, dim, activation="gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # (B, h, w, D)
        return x + self.pwconv1(self.norm(y)).permute(0, 3, 1, 2)


class MLPBlock(nn.Module):
    """x + Linear(GELU(Linear(LayerNorm(x)))) with a 4x wider hidden layer."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(dim)
        # GELU kept as its own entry: the checkpoint names the linears layers.0 and layers.2
        self.layers = nn.ModuleList([Linear(dim, 4 * dim), nn.GELU(), Linear(4 * dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm_in(x)
        for layer in self.layers:
            y = layer(y)
        return x + y


class SegmentationHead(nn.Module):
    """Mask logits at 1/downsample_ratio of the input size, one set per decoder layer.

    The pixel features are refined by one depthwise block per decoder layer, cumulatively;
    the encoder's proposals use the unrefined features.
    """

    def __init__(self, dim: int, num_blocks: int, downsample_ratio: int) -> None:
        super().__init__()
        self.downsample_ratio = downsample_ratio
        self.bias = nn.Parameter(torch.zeros(1))
        self.blocks = nn.ModuleList(DepthwiseConvBlock(dim) for _ in range(num_blocks))
        self.spatial_features_proj = nn.Conv2d(dim, dim, kernel_size=1)  # applied as a linear, see _project
        self._packed_proj = PackedWeight()
        self.query_features_block = MLPBlock(dim)
        self.query_features_proj = Linear(dim, dim)

    def forward(self, level: torch.Tensor, hidden: torch.Tensor, enc_features: torch.Tensor,
                image_size: tuple[int, int], every_layer: bool = True
                ) -> tuple[list[MaskFactors | None], MaskFactors | None]:
        """level (B, D, h, w) first pyramid level; hidden (layers, B, Q, D) decoder outputs;
        enc_features (B, K, D) selected encoder proposals; image_size the padded input (H, W).

        Returns the factors of each decoder layer and of the encoder proposals; with
        every_layer=False only the final layer's (the others None, their projections skipped).
        """
        size = (image_size[0] // self.downsample_ratio, image_size[1] // self.downsample_ratio)
        spatial = F.interpolate(level, size=size, mode="bilinear", align_corners=False)
        encoder = self._factors(spatial, enc_features) if every_layer else None
        layers, last = [], min(len(self.blocks), len(hidden)) - 1
        for index, (block, queries) in enumerate(zip(self.blocks, hidden)):
            spatial = block(spatial)  # cumulative: every block runs
            wanted = every_layer or index == last
            layers.append(self._factors(spatial, queries) if wanted else None)
        return layers, encoder

    def _factors(self, spatial: torch.Tensor, queries: torch.Tensor) -> MaskFactors:
        return MaskFactors(self._project(spatial), self.query_features_proj(self.query_features_block(queries)),
                           self.bias)

    def _project(self, spatial: torch.Tensor) -> torch.Tensor:
        """spatial_features_proj, the 1x1 convolution, as a linear over channels-last pixels (the
        pixel features are channels-last from the projector on): on the CPU about a third faster
        forward and backward than the convolution, the same values to float rounding."""
        conv = self.spatial_features_proj
        pixels = spatial.permute(0, 2, 3, 1)  # (B, h, w, D)
        return linear(pixels, conv.weight.flatten(1), conv.bias, packed=self._packed_proj).permute(0, 3, 1, 2)

