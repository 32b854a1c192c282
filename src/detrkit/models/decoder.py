"""Post-norm deformable decoder: group-restricted self-attention, cross-attention, FFN."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.models.deform_attn import MSDeformAttn
from detrkit.models.mlp import MLP
from detrkit.ops.chunked_mlp import chunked_relu_mlp, chunking_applies
from detrkit.ops.linear import Linear, PackedWeight, linear
from detrkit.ops.position import box_sine_embedding


class SelfAttention(nn.Module):
    """Multi-head attention with `nn.MultiheadAttention`'s parameter names, on SDPA."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = Linear(dim, dim)
        self._packed_qk, self._packed_v = PackedWeight(), PackedWeight()
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, query_key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """query_key (B, L, D) feeds queries and keys; value (B, L, D); mask (L, L) additive
        attention bias (-inf where blocked), or None."""
        batch, length, dim = value.shape
        w, b = self.in_proj_weight, self.in_proj_bias
        qk = linear(query_key, w[: 2 * dim], b[: 2 * dim], packed=self._packed_qk).view(batch, length, 2, self.heads, -1)
        v = linear(value, w[2 * dim:], b[2 * dim:], packed=self._packed_v).view(batch, length, self.heads, -1)
        q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, L, head_dim)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, sa_heads: int, ca_heads: int, levels: int, points: int, ffn_dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.self_attn = SelfAttention(dim, sa_heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = MSDeformAttn(dim, levels, ca_heads, points)
        self.linear1 = Linear(dim, ffn_dim, activation="relu")
        self.linear2 = Linear(ffn_dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, tgt: torch.Tensor, query_pos: torch.Tensor, reference: torch.Tensor,
                memory: torch.Tensor, shapes: list[tuple[int, int]], padding: torch.Tensor | None,
                groups: int) -> torch.Tensor:
        batch, queries, dim = tgt.shape
        with_pos = tgt + query_pos
        # Group DETR: (B, G*N, D) -> (B*G, N, D) so queries attend only within their group.
        grouped = (batch * groups, queries // groups, dim)
        attn = self.self_attn(with_pos.reshape(grouped), tgt.reshape(grouped)).reshape(batch, queries, dim)
        tgt = self.norm1(tgt + attn)
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, reference, memory, shapes, padding))
        return self.norm3(tgt + self.ffn(tgt))

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        if chunking_applies(x, self.linear1.weight):  # CPU training: cache-sized row chunks
            return chunked_relu_mlp(x, (self.linear1.weight, self.linear2.weight), (self.linear1.bias, self.linear2.bias))
        return self.linear2(self.linear1(x))


class Decoder(nn.Module):
    """Runs every layer against one fixed set of reference boxes (lite reference refinement)."""

    def __init__(self, layer: DecoderLayer, num_layers: int) -> None:
        super().__init__()
        # Clones of one layer, as in the reference: the transformer then re-draws every >=2-dim
        # weight, so only the FFN biases (PyTorch default init) start equal in all layers.
        self.dim = layer.dim
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = nn.LayerNorm(layer.dim)
        self.ref_point_head = MLP(2 * layer.dim, layer.dim, layer.dim, 2)

    def query_positions(self, reference: torch.Tensor, valid_ratios: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """reference (B, Q, 4); valid_ratios (B, levels, 2) as (w, h). Returns the per-level
        references scaled to the unpadded extent (B, Q, levels, 4) and the query positions (B, Q, D)."""
        ratios = valid_ratios.repeat(1, 1, 2)[:, None]  # (B, 1, levels, 4) as (w, h, w, h)
        scaled = reference[:, :, None] * ratios  # (B, Q, levels, 4)
        return scaled, self.ref_point_head(box_sine_embedding(scaled[:, :, 0], self.dim // 2))

    def forward(self, tgt: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]], padding: torch.Tensor | None,
                valid_ratios: torch.Tensor, groups: int) -> torch.Tensor:
        """tgt (B, Q, D); reference (B, Q, 4); valid_ratios (B, levels, 2) as (w, h).
        Returns the normed output of every layer, (layers, B, Q, D)."""
        scaled, query_pos = self.query_positions(reference, valid_ratios)
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, query_pos, scaled, memory, shapes, padding, groups)
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)
