"""Multi-scale projector: fuses the ViT's tapped maps into hidden_dim-channel pyramid levels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LEVEL_SCALES = {"P3": 2.0, "P4": 1.0, "P5": 0.5}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvX(nn.Module):
    """Conv (no bias) -> norm -> activation."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1, *, layer_norm: bool = True,
                 act: type[nn.Module] = nn.SiLU) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False)
        self.bn = LayerNorm2d(cout) if layer_norm else nn.BatchNorm2d(cout)
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 ConvX, no residual."""

    def __init__(self, channels: int, layer_norm: bool) -> None:
        super().__init__()
        self.cv1 = ConvX(channels, channels, 3, layer_norm=layer_norm)
        self.cv2 = ConvX(channels, channels, 3, layer_norm=layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


class C2f(nn.Module):
    """CSP block: split, chain `n` bottlenecks on one half, concatenate every step, fuse."""

    def __init__(self, cin: int, cout: int, n: int = 3, layer_norm: bool = True) -> None:
        super().__init__()
        self.hidden = cout // 2
        self.cv1 = ConvX(cin, 2 * self.hidden, 1, layer_norm=layer_norm)
        self.cv2 = ConvX((2 + n) * self.hidden, cout, 1, layer_norm=layer_norm)
        self.m = nn.ModuleList(Bottleneck(self.hidden, layer_norm) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).split(self.hidden, dim=1))
        for bottleneck in self.m:
            parts.append(bottleneck(parts[-1]))
        return self.cv2(torch.cat(parts, dim=1))


def _sampler(channels: int, scale: float, layer_norm: bool) -> tuple[nn.Sequential, int]:
    """Resample one ViT map to a level's stride; returns the module and its output channels."""
    if scale == 2.0:
        return nn.Sequential(nn.ConvTranspose2d(channels, channels // 2, 2, stride=2)), channels // 2
    if scale == 0.5:
        return nn.Sequential(ConvX(channels, channels, 3, 2, layer_norm=layer_norm, act=nn.ReLU)), channels
    return nn.Sequential(), channels


class MultiScaleProjector(nn.Module):
    def __init__(self, in_channels: int, num_inputs: int, out_channels: int, levels: list[str],
                 layer_norm: bool = True) -> None:
        super().__init__()
        self.stages_sampling = nn.ModuleList()
        self.stages = nn.ModuleList()
        for level in levels:
            samplers = [_sampler(in_channels, LEVEL_SCALES[level], layer_norm) for _ in range(num_inputs)]
            self.stages_sampling.append(nn.ModuleList(module for module, _ in samplers))
            fused = sum(channels for _, channels in samplers)
            norm = LayerNorm2d(out_channels) if layer_norm else nn.BatchNorm2d(out_channels)
            self.stages.append(nn.Sequential(C2f(fused, out_channels, 3, layer_norm), norm))

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = []
        for samplers, stage in zip(self.stages_sampling, self.stages):
            outputs.append(stage(torch.cat([s(f) for s, f in zip(samplers, features)], dim=1)))
        return outputs  # one (B, out_channels, h, w) map per level
