"""Windowed DINOv2 vision transformer that returns same-resolution feature maps of tapped blocks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from detrkit.ops.linear import Linear, PackedWeight, linear, packed_linear, packing_applies, scaled_residual_linear
from detrkit.ops.position import resize_grid_embeddings


class PatchEmbeddings(nn.Module):
    def __init__(self, in_channels: int, width: int, patch_size: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(in_channels, width, kernel_size=patch_size, stride=patch_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projection(pixels.to(self.projection.weight.dtype))  # (B, C, Hp, Wp)


class Embeddings(nn.Module):
    """Patch tokens plus position embeddings; a CLS copy prepended to every window."""

    def __init__(self, in_channels: int, width: int, patch_size: int, grid: int, registers: int) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        # never used in a forward pass (DINOv2 masked-image pre-training only); kept for the checkpoint
        # layout, frozen so that optimizers and DDP leave it alone
        self.mask_token = nn.Parameter(torch.zeros(1, width), requires_grad=False)
        self.register_tokens = nn.Parameter(torch.zeros(1, registers, width)) if registers else None
        self.position_embeddings = nn.Parameter(torch.zeros(1, grid * grid + 1, width))
        self.patch_embeddings = PatchEmbeddings(in_channels, width, patch_size)
        self._pos_cache: tuple[tuple, torch.Tensor] | None = None

    def patch_position_embeddings(self, rows: int, cols: int) -> torch.Tensor:
        """(rows * cols, C) position embeddings of the patch grid, resized bicubically if needed."""
        table = self.position_embeddings[0, 1:]
        grid = math.isqrt(int(table.shape[0]))  # int(): traced shapes are tensors
        if (rows, cols) == (grid, grid):
            return table
        return self._resized_position_embeddings(rows, cols)

    # An eager island under torch.compile: symbolic shapes break the antialiased-bicubic backward.
    @torch.compiler.disable
    def _resized_position_embeddings(self, rows: int, cols: int) -> torch.Tensor:
        """The patch grid's embeddings bicubically resized to (rows * cols, C); cached outside autograd."""
        table = self.position_embeddings[0, 1:]
        key = (rows, cols, table._version, table.data_ptr(), table.dtype)
        if not torch.is_grad_enabled() and self._pos_cache is not None and self._pos_cache[0] == key:
            return self._pos_cache[1]
        result = resize_grid_embeddings(table, rows, cols)
        if not torch.is_grad_enabled():
            self._pos_cache = (key, result)
        return result

    def forward(self, pixels: torch.Tensor, windows: int) -> torch.Tensor:
        patches = self.patch_embeddings(pixels)
        batch, width, rows, cols = patches.shape
        if rows % windows or cols % windows:
            raise ValueError(f"a {rows}x{cols} patch grid does not split into {windows}x{windows} windows")
        tokens = patches.flatten(2).transpose(1, 2) + self.patch_position_embeddings(rows, cols)
        # (B, windows, rows/windows, windows, cols/windows, C) -> one sequence per window
        win_rows, win_cols = rows // windows, cols // windows
        tokens = tokens.view(batch, windows, win_rows, windows, win_cols, width)
        tokens = tokens.permute(0, 1, 3, 2, 4, 5).reshape(batch * windows**2, win_rows * win_cols, width)
        cls = (self.cls_token + self.position_embeddings[:, :1]).expand(tokens.shape[0], 1, width)
        parts = [cls, tokens]
        if self.register_tokens is not None:
            parts.insert(1, self.register_tokens.expand(tokens.shape[0], -1, -1))
        return torch.cat(parts, dim=1)  # (B * windows^2, 1 + R + tokens per window, C)


class SelfAttentionProjections(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)


class AttentionOutput(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.dense = Linear(width, width)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention = SelfAttentionProjections(width)
        self.output = AttentionOutput(width)
        self._packed_qkv = PackedWeight()

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The three projections as one matrix product."""
        proj = self.attention
        weights = (proj.query.weight, proj.key.weight, proj.value.weight)
        bias = torch.cat((proj.query.bias, proj.key.bias, proj.value.bias))
        if packing_applies(x, proj.query.weight):
            rows = x.numel() // x.shape[-1]
            return packed_linear(x, self._packed_qkv.get(weights, lambda: torch.cat(weights), rows), bias)
        return linear(x, torch.cat(weights), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention before the output projection (applied by the block): (B, L, C)."""
        batch, length, width = x.shape
        qkv = self._qkv(x).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, L, head_dim)
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(batch, length, width)


class LayerScale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(width))


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = Linear(width, hidden, activation="gelu")
        self.fc2 = Linear(hidden, width)



class DropPath(nn.Module):
    """Stochastic depth: drop whole residual branches per sample while training."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep


class Block(nn.Module):
    """Pre-norm ViT block; a global block attends across all windows of an image."""

    def __init__(self, width: int, heads: int, windowed: bool, drop_path: float) -> None:
        super().__init__()
        self.windowed = windowed
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attention = Attention(width, heads)
        self.layer_scale1 = LayerScale(width)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Mlp(width, 4 * width)
        self.layer_scale2 = LayerScale(width)
        self.drop_path = DropPath(drop_path)
        self._packed_dense, self._packed_fc2 = PackedWeight(), PackedWeight()

    def forward(self, x: torch.Tensor, windows_per_image: int) -> torch.Tensor:
        sequences, length, width = x.shape
        attn_in = self.norm1(x)
        if not self.windowed:  # (B * windows, T, C) -> (B, windows * T, C)
            attn_in = attn_in.view(sequences // windows_per_image, windows_per_image * length, width)
        attn = self.attention(attn_in).view(sequences, length, width)
        x = self._residual(attn, x, self.attention.output.dense, self.layer_scale1, self._packed_dense)
        return self._residual(self.mlp.fc1(self.norm2(x)), x, self.mlp.fc2, self.layer_scale2, self._packed_fc2)

    def _residual(self, inputs: torch.Tensor, x: torch.Tensor, dense: nn.Linear, scale: LayerScale,
                  packed: PackedWeight) -> torch.Tensor:
        """x + drop_path(layer_scale * dense(inputs))."""
        if self.training and self.drop_path.drop_prob > 0:
            return x + self.drop_path(scale.lambda1 * dense(inputs))
        return scaled_residual_linear(inputs, x, dense.weight, dense.bias, scale.lambda1, packed)


class Encoder(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(blocks)


class WindowedDinov2(nn.Module):
    """DINOv2 with windowed attention in all blocks but the tapped ones (spec section 2)."""

    def __init__(self, *, in_channels: int, width: int, heads: int, patch_size: int, grid: int,
                 num_windows: int, out_feature_indexes: list[int], registers: int = 0,
                 drop_path: float = 0.0, gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.num_windows = num_windows
        self.num_prefix = 1 + registers
        self.taps = [index - 1 for index in out_feature_indexes]  # stage K is block K-1's output
        self.gradient_checkpointing = gradient_checkpointing
        num_blocks = out_feature_indexes[-1]
        # Quirk of the published models: the stage numbers are used as *block* numbers here.
        global_blocks = set(out_feature_indexes) if num_windows > 1 else set(range(num_blocks))
        self.embeddings = Embeddings(in_channels, width, patch_size, grid, registers)
        self.encoder = Encoder([Block(width, heads, i not in global_blocks, drop_path) for i in range(num_blocks)])
        self.layernorm = nn.LayerNorm(width, eps=1e-6)

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """(B, C_in, H, W) -> one (B, C, H/patch, W/patch) map per tapped stage."""
        batch, _, height, width = pixels.shape
        x = self.embeddings(pixels, self.num_windows)
        windows = self.num_windows**2
        features = []
        for index, block in enumerate(self.encoder.layer):
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, windows, use_reentrant=False)
            else:
                x = block(x, windows)
            if index in self.taps:
                features.append(self._to_map(self.layernorm(x), batch, height, width))
        return features

    def _to_map(self, x: torch.Tensor, batch: int, height: int, width: int) -> torch.Tensor:
        patch = self.embeddings.patch_embeddings.projection.kernel_size[0]
        rows, cols, windows = height // patch, width // patch, self.num_windows
        tokens = x[:, self.num_prefix:]  # (B * windows^2, rows/windows * cols/windows, C)
        tokens = tokens.reshape(batch, windows, windows, rows // windows, cols // windows, -1)
        # (B, win_i, win_j, r, c, C) -> (B, C, win_i, r, win_j, c) = (B, C, rows, cols)
        return tokens.permute(0, 5, 1, 3, 2, 4).reshape(batch, -1, rows, cols)


class DinoV2(nn.Module):
    """Checkpoint-layout shell: published weights nest the ViT one level down (`encoder.encoder`)."""

    def __init__(self, vit: WindowedDinov2) -> None:
        super().__init__()
        self.encoder = vit

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        return self.encoder(pixels)


def init_vit_weights(vit: WindowedDinov2) -> None:
    """DINOv2's from-scratch initialisation: truncated normal(0.02) weights, zero biases."""
    for module in vit.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    nn.init.trunc_normal_(vit.embeddings.position_embeddings, std=0.02)
    nn.init.trunc_normal_(vit.embeddings.cls_token, std=0.02)
