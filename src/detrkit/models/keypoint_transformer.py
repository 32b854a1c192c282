"""Two-stage transformer of keypoint models: proposals and decoder queries gain keypoint queries."""

from __future__ import annotations

import copy

import torch
from torch import nn

from detrkit.models.heads.keypoint import KeypointHead
from detrkit.models.keypoint_decoder import ConditionalQueryInitializer, KeypointDecoder
from detrkit.models.two_stage import FlatMemory, Proposals, Transformer, TransformerOutput


class KeypointTransformer(Transformer):
    """Keypoint queries conditioned on each decoder query run through the keypoint decoder;
    keypoint queries conditioned on each selected proposal give the encoder's keypoint
    predictions, through per-group copies of the keypoint head."""

    def __init__(self, decoder: KeypointDecoder, keypoint_head: KeypointHead, *, groups: int,
                 num_queries: int) -> None:
        super().__init__(decoder, groups=groups, num_queries=num_queries)
        count, width = decoder.keypoint_pos_embed.shape
        self.keypoint_query_initializer = ConditionalQueryInitializer(decoder.dim, count, width)
        self.keypoint_query_initializer_enc = ConditionalQueryInitializer(decoder.dim, count, width)
        # the reference draws these in its transformer-wide xavier pass too (the last adaLN bias stays 0)
        for initializer in (self.keypoint_query_initializer, self.keypoint_query_initializer_enc):
            for parameter in initializer.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        self.enc_out_keypoint_embed = nn.ModuleList(copy.deepcopy(keypoint_head) for _ in range(groups))

    def forward(self, memory: FlatMemory, query_feat: torch.Tensor, refpoint: torch.Tensor,
                groups: int) -> TransformerOutput:
        """As Transformer.forward; the output also holds the decoder's keypoint states and the
        proposals' decoded keypoints. Keypoints cross-attend memory.keypoint_tokens when present."""
        proposals = self.select_proposals(memory, groups)
        tgt, reference = self.decoder_queries(proposals, query_feat, refpoint)
        # the content queries are the same for every image: condition once, then broadcast
        keypoints = self.keypoint_query_initializer(query_feat).expand(tgt.shape[0], -1, -1, -1)
        keypoint_memory = memory.tokens if memory.keypoint_tokens is None else memory.keypoint_tokens
        hidden, states = self.decoder(tgt, reference, memory.tokens, memory.shapes, memory.padding,
                                      memory.valid_ratios, groups, keypoints, keypoint_memory)
        return TransformerOutput(hidden, reference, proposals.logits, proposals.boxes, proposals.features,
                                 keypoints=states, enc_keypoints=self.encoder_keypoints(proposals, groups))

    def encoder_keypoints(self, proposals: Proposals, groups: int) -> torch.Tensor:
        """(B, G*k, K', 8): each group's keypoint head decodes keypoint queries conditioned on its
        proposals, against the proposals' boxes."""
        states = self.keypoint_query_initializer_enc(proposals.features)  # (B, G*k, K, Dk)
        per_group = zip(self.enc_out_keypoint_embed, states.chunk(groups, 1), proposals.boxes.chunk(groups, 1))
        return torch.cat([head.predict(group_states, boxes) for head, group_states, boxes in per_group], 1)
