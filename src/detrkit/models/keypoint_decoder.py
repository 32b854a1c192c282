"""GroupPose keypoint stream of the decoder: conditional keypoint queries and the per-layer
keypoint attention that runs beside each instance query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.models.decoder import Decoder, DecoderLayer, SelfAttention
from detrkit.models.deform_attn import MSDeformAttn
from detrkit.ops.chunked_mlp import chunked_relu_mlp, chunking_applies
from detrkit.ops.linear import Linear


class ConditionalQueryInitializer(nn.Module):
    """K learned keypoint queries modulated by a condition vector (adaLN-style): with
    scale, shift, gate = adaLN(c), out = out_proj((1 + scale) * LN(queries) + shift) * gate + queries."""

    def __init__(self, dim: int, num_keypoints: int, out_dim: int) -> None:
        super().__init__()
        self.queries = nn.Parameter(torch.randn(num_keypoints, out_dim))
        # GELU kept as its own entry: the checkpoint names the linears adaLN_modulation.0 and .2
        self.adaLN_modulation = nn.Sequential(Linear(dim, dim), nn.GELU(), Linear(dim, 3 * out_dim))
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)
        self.out_proj = Linear(out_dim, out_dim)

    def forward(self, condition: torch.Tensor) -> torch.Tensor:
        """condition (..., dim) -> keypoint queries (..., K, out_dim)."""
        normed = F.layer_norm(self.queries, self.queries.shape[-1:])  # affine-free, eps 1e-5
        scale, shift, gate = self.adaLN_modulation(condition[..., None, :]).chunk(3, dim=-1)
        return self.out_proj((scale + 1.0) * normed + shift) * gate + self.queries


def keypoint_class_mask(schema: Sequence[int]) -> torch.Tensor:
    """(1 + K, 1 + K) bool, True where attention is blocked: between keypoints of different
    classes. Token 0 is the instance, which sees and is seen by every keypoint."""
    owner = torch.tensor([-1] + [c for c, count in enumerate(schema) for _ in range(count)])
    return (owner[:, None] != owner[None, :]) & (owner[:, None] >= 0) & (owner[None, :] >= 0)


@dataclass
class KeypointContext:
    """What every keypoint layer reads besides the states."""

    memory: torch.Tensor  # (B, Len, D) the memory keypoints cross-attend
    position: torch.Tensor  # (K, Dk) keypoint position embeddings
    mask: torch.Tensor | None  # (1 + K, 1 + K) additive attention bias, None when nothing is blocked


class KeypointDecoderLayer(DecoderLayer):
    """A decoder layer followed by its keypoint block: instance-keypoint self-attention per
    query, optional attention across queries per keypoint, deformable cross-attention around
    the instance's box, FFN. With downscale > 1 keypoints live in dim / downscale channels."""

    def __init__(self, dim: int, sa_heads: int, ca_heads: int, levels: int, points: int, ffn_dim: int, *,
                 downscale: int = 1, cross_attn: bool = True, inter_instance: bool = False) -> None:
        super().__init__(dim, sa_heads, ca_heads, levels, points, ffn_dim)
        self.keypoint_dim = width = dim // downscale

        def project(cin: int, cout: int) -> nn.Module:
            return Linear(cin, cout) if downscale > 1 else nn.Identity()

        self.inst_in_proj, self.inst_pos_in_proj = project(dim, width), project(dim, width)
        self.inst_out_proj, self.memory_in_proj = project(width, dim), project(dim, width)
        self.kp_inst_self_attn = SelfAttention(width, max(1, sa_heads // downscale))
        self.kp_inst_norm = nn.LayerNorm(dim)
        self.kp_norm = nn.LayerNorm(width)
        self.inter_inst_kp_attn = SelfAttention(width, max(1, ca_heads // downscale)) if inter_instance else None
        self.inter_inst_kp_norm = nn.LayerNorm(width) if inter_instance else None
        self.kp_cross_attn = MSDeformAttn(width, levels, max(1, ca_heads // downscale), points) if cross_attn else None
        self.kp_cross_attn_norm = nn.LayerNorm(width) if cross_attn else None
        self.kp_linear1 = Linear(width, 4 * dim // downscale, activation="relu")
        self.kp_linear3 = Linear(4 * dim // downscale, width)
        self.kp_norm5 = nn.LayerNorm(width)
        self.instance_kp_layer_scale = nn.Parameter(torch.full((1,), 1e-6))

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, reference: torch.Tensor,
                memory: torch.Tensor, shapes: list[tuple[int, int]], padding: torch.Tensor | None,
                groups: int, keypoints: torch.Tensor, context: KeypointContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer's arguments plus keypoints (B, Q, K, Dk); returns (tgt, keypoints)."""
        tgt = super().forward(tgt, query_pos, reference, memory, shapes, padding, groups)
        position = self.inst_pos_in_proj(query_pos)  # (B, Q, Dk)
        tgt, keypoints = self._instance_attention(tgt, keypoints, context)
        if self.inter_inst_kp_attn is not None:
            keypoints = self._inter_instance_attention(keypoints, position)
        if self.kp_cross_attn is not None:
            keypoints = self._cross_attention(keypoints, position, reference, context.memory, shapes, padding)
        return tgt, self.kp_norm5(keypoints + self._keypoint_ffn(keypoints))

    def _instance_attention(self, tgt: torch.Tensor, keypoints: torch.Tensor, context: KeypointContext
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query, attention over [instance token, its K keypoints]; the instance's update is
        scaled by the (learned, near-zero at init) layer scale."""
        batch, queries, count, width = keypoints.shape
        tokens = torch.cat((self.inst_in_proj(tgt)[:, :, None], keypoints), 2).reshape(-1, 1 + count, width)
        position = torch.cat((context.position.new_zeros(1, width), context.position))  # (1 + K, Dk)
        out = self.kp_inst_self_attn(tokens + position, tokens, context.mask).view(batch, queries, 1 + count, width)
        tgt = self.kp_inst_norm(tgt + self.inst_out_proj(out[:, :, 0]) * self.instance_kp_layer_scale)
        return tgt, self.kp_norm(keypoints + out[:, :, 1:])

    def _inter_instance_attention(self, keypoints: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Per keypoint index, attention across all queries, positioned by their boxes."""
        batch, queries, count, width = keypoints.shape
        swapped = keypoints.transpose(1, 2).reshape(batch * count, queries, width)
        pos = position[:, None].expand(batch, count, queries, width).reshape(batch * count, queries, width)
        out = self.inter_inst_kp_attn(swapped + pos, swapped).view(batch, count, queries, width).transpose(1, 2)
        return self.inter_inst_kp_norm(keypoints + out)

    def _cross_attention(self, keypoints: torch.Tensor, position: torch.Tensor, reference: torch.Tensor,
                         memory: torch.Tensor, shapes: list[tuple[int, int]], padding: torch.Tensor | None
                         ) -> torch.Tensor:
        """Every keypoint samples the memory around its instance's reference box."""
        batch, queries, count, width = keypoints.shape
        query = (keypoints + position[:, :, None]).reshape(batch, queries * count, width)
        # (B, Q, levels, 4) -> (B, Q*K, levels, 4): one box per keypoint
        boxes = reference[:, :, None].expand(-1, -1, count, -1, -1).flatten(1, 2)
        sampled = self.kp_cross_attn(query, boxes, self.memory_in_proj(memory), shapes, padding)
        return self.kp_cross_attn_norm(keypoints + sampled.view(batch, queries, count, width))


    def _keypoint_ffn(self, x: torch.Tensor) -> torch.Tensor:
        if chunking_applies(x, self.kp_linear1.weight):  # CPU training: cache-sized row chunks
            first, second = self.kp_linear1, self.kp_linear3
            return chunked_relu_mlp(x, (first.weight, second.weight), (first.bias, second.bias))
        return self.kp_linear3(self.kp_linear1(x))


class KeypointDecoder(Decoder):
    """The decoder with a keypoint stream: returns the normed instance outputs and the keypoint
    states of every layer."""

    def __init__(self, layer: KeypointDecoderLayer, num_layers: int, schema: Sequence[int]) -> None:
        super().__init__(layer, num_layers)
        self.keypoint_pos_embed = nn.Parameter(torch.randn(sum(schema), layer.keypoint_dim))
        self.register_buffer("keypoint_class_mask", keypoint_class_mask(schema))
        self._classes_apart = sum(1 for count in schema if count > 0) > 1  # else the mask blocks nothing

    def forward(self, tgt: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], padding: torch.Tensor | None, valid_ratios: torch.Tensor,
                groups: int, keypoints: torch.Tensor, keypoint_memory: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's arguments plus keypoints (B, Q, K, Dk) initial keypoint queries and
        keypoint_memory (B, Len, D). Returns (layers, B, Q, D) and (layers, B, Q, K, Dk)."""
        scaled, query_pos = self.query_positions(reference, valid_ratios)
        mask = None
        if self._classes_apart:
            blocked = self.keypoint_class_mask
            mask = torch.zeros(blocked.shape, dtype=tgt.dtype, device=tgt.device).masked_fill(blocked, float("-inf"))
        context = KeypointContext(keypoint_memory, self.keypoint_pos_embed, mask)
        outputs, states = [], []
        for layer in self.layers:
            tgt, keypoints = layer(tgt, query_pos, scaled, memory, shapes, padding, groups, keypoints, context)
            outputs.append(self.norm(tgt))
            states.append(keypoints)
        return torch.stack(outputs), torch.stack(states)
