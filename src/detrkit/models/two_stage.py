"""Two-stage transformer: per-group top-k proposals from the memory seed the decoder's boxes."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from detrkit.models.decoder import Decoder
from detrkit.models.deform_attn import MSDeformAttn
from detrkit.models.mlp import MLP
from detrkit.ops.boxes import apply_box_delta
from detrkit.ops.linear import Linear


@dataclass
class FlatMemory:
    """Pyramid levels flattened into one sequence, with what attention needs to read it."""

    tokens: torch.Tensor  # (B, Len, D)
    padding: torch.Tensor | None  # (B, Len) True where padded; None when nothing is
    shapes: list[tuple[int, int]]
    valid_sizes: torch.Tensor  # (B, levels, 2) unpadded extent in cells, as (w, h)
    keypoint_tokens: torch.Tensor | None = None  # (B, Len, D) a second projector's memory, same layout

    @property
    def valid_ratios(self) -> torch.Tensor:
        # divided by Python numbers: a tensor of the shapes would be a blocking host -> device copy
        ratios = [torch.stack((self.valid_sizes[:, i, 0] / w, self.valid_sizes[:, i, 1] / h), -1)
                  for i, (h, w) in enumerate(self.shapes)]
        return torch.stack(ratios, 1)  # (B, levels, 2)


@dataclass
class Proposals:
    """The encoder's top-k memory positions per group, concatenated group after group."""

    features: torch.Tensor  # (B, G*k, D) the selected, projected memory
    logits: torch.Tensor  # (B, G*k, C) their class logits
    boxes: torch.Tensor  # (B, G*k, 4) their boxes (with gradient)


@dataclass
class TransformerOutput:
    hidden: torch.Tensor  # (layers, B, Q, D) normed decoder outputs
    reference: torch.Tensor  # (B, Q, 4) cxcywh boxes every layer refines from
    enc_logits: torch.Tensor  # (B, G*k, C) class logits of the selected proposals
    enc_boxes: torch.Tensor  # (B, G*k, 4)
    enc_features: torch.Tensor  # (B, G*k, D) the selected, projected memory
    keypoints: torch.Tensor | None = None  # (layers, B, Q, K, Dk) keypoint states of keypoint models
    enc_keypoints: torch.Tensor | None = None  # (B, G*k, K', 8) decoded keypoints of the proposals


def flatten_levels(levels: list[torch.Tensor], masks: list[torch.Tensor] | None,
                   keypoint_levels: list[torch.Tensor] | None = None) -> FlatMemory:
    """levels: (B, D, h, w) maps; masks: matching (B, h, w) bool padding masks or None;
    keypoint_levels: a second projector's maps of the same sizes, or None."""
    shapes = [(level.shape[-2], level.shape[-1]) for level in levels]
    tokens = _flatten(levels)
    keypoint_tokens = None if keypoint_levels is None else _flatten(keypoint_levels)
    batch, device = tokens.shape[0], tokens.device
    if masks is None:  # filled on the device: a tensor of the shapes would be a blocking host -> device copy
        full = [torch.full((batch,), float(n), device=device) for h, w in shapes for n in (w, h)]
        return FlatMemory(tokens, None, shapes, torch.stack(full, 1).view(batch, len(shapes), 2), keypoint_tokens)
    # unpadded rows counted down column 0, unpadded columns along row 0
    sizes = [torch.stack(((~m[:, 0, :]).sum(1), (~m[:, :, 0]).sum(1)), -1) for m in masks]
    padding = torch.cat([mask.flatten(1) for mask in masks], dim=1)
    return FlatMemory(tokens, padding, shapes, torch.stack(sizes, 1).float(), keypoint_tokens)


def _flatten(levels: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([level.flatten(2).transpose(1, 2) for level in levels], dim=1)  # (B, Len, D)


def grid_proposals(memory: FlatMemory) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-size boxes centred on every memory cell: (B, Len, 4) cxcywh, and (B, Len) validity."""
    device, batch = memory.tokens.device, memory.tokens.shape[0]
    proposals = []
    for level, (height, width) in enumerate(memory.shapes):
        ys, xs = torch.meshgrid(torch.arange(height, device=device, dtype=torch.float32),
                                torch.arange(width, device=device, dtype=torch.float32), indexing="ij")
        extent = memory.valid_sizes[:, level].view(batch, 1, 1, 2)  # (w, h) in cells
        centres = (torch.stack((xs, ys), -1)[None] + 0.5) / extent  # (B, h, w, 2)
        size = torch.full_like(centres, 0.05 * 2.0**level)
        proposals.append(torch.cat((centres, size), -1).view(batch, -1, 4))
    proposals = torch.cat(proposals, 1)
    valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1)
    if memory.padding is not None:
        valid &= ~memory.padding
    return proposals.masked_fill(~valid[..., None], 0.0), valid


def reset_transformer_parameters(module: nn.Module) -> None:
    """Xavier-uniform for every >=2-dim parameter, then each deformable attention's own init."""
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)
    for child in module.modules():
        if isinstance(child, MSDeformAttn):
            child.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, decoder: Decoder, *, groups: int, num_queries: int) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.decoder = decoder
        self.enc_output = nn.ModuleList(Linear(decoder.dim, decoder.dim) for _ in range(groups))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(decoder.dim) for _ in range(groups))
        reset_transformer_parameters(self)
        self.enc_out_bbox_embed: nn.ModuleList | None = None
        self.enc_out_class_embed: nn.ModuleList | None = None

    def attach_encoder_heads(self, class_head: nn.Linear, box_head: MLP, groups: int) -> None:
        """Give each group its own copy of the detection heads for scoring proposals."""
        self.enc_out_bbox_embed = nn.ModuleList(copy.deepcopy(box_head) for _ in range(groups))
        self.enc_out_class_embed = nn.ModuleList(copy.deepcopy(class_head) for _ in range(groups))

    def forward(self, memory: FlatMemory, query_feat: torch.Tensor, refpoint: torch.Tensor,
                groups: int) -> TransformerOutput:
        """query_feat (G*N, D) and refpoint (G*N, 4) learned rows for the active groups."""
        proposals = self.select_proposals(memory, groups)
        tgt, reference = self.decoder_queries(proposals, query_feat, refpoint)
        hidden = self.decoder(tgt, reference, memory.tokens, memory.shapes, memory.padding,
                              memory.valid_ratios, groups)
        return TransformerOutput(hidden, reference, proposals.logits, proposals.boxes, proposals.features)

    def select_proposals(self, memory: FlatMemory, groups: int) -> Proposals:
        """Each group scores every memory position with its own heads and keeps its top k."""
        # not cached (about 70 us on CPU): torch.compile would guard a cache, one recompile per resolution
        proposals, valid = grid_proposals(memory)
        masked_memory = memory.tokens.masked_fill(~valid[..., None], 0.0)
        k = min(self.num_queries, memory.tokens.shape[1])
        features, logits, boxes = [], [], []
        for group in range(groups):
            projected = self.enc_output_norm[group](self.enc_output[group](masked_memory))
            scores = self.enc_out_class_embed[group](projected)  # (B, Len, C)
            top = scores.max(-1).values.topk(k, dim=1).indices  # (B, k)
            chosen = projected.gather(1, top[..., None].expand(-1, -1, projected.shape[-1]))
            anchors = proposals.gather(1, top[..., None].expand(-1, -1, 4))
            features.append(chosen)
            logits.append(scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1])))
            boxes.append(apply_box_delta(self.enc_out_bbox_embed[group](chosen), anchors))
        return Proposals(torch.cat(features, 1), torch.cat(logits, 1), torch.cat(boxes, 1))

    @staticmethod
    def decoder_queries(proposals: Proposals, query_feat: torch.Tensor, refpoint: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """The learned content queries (B, Q, D) and reference boxes (B, Q, 4): the learned box
        rows applied as deltas to the (detached) proposal boxes."""
        batch, selected = proposals.boxes.shape[:2]
        learned = refpoint[None].expand(batch, -1, -1)
        reference = apply_box_delta(learned[:, :selected], proposals.boxes.detach())
        if selected < refpoint.shape[0]:  # memory shorter than the query count
            reference = torch.cat((reference, learned[:, selected:]), 1)
        return query_feat[None].expand(batch, -1, -1), reference
