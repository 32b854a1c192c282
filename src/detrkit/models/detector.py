"""The detector network: backbone, two-stage transformer and heads, in checkpoint layout."""

from __future__ import annotations

import torch
from torch import nn

from detrkit.models.backbone import Backbone
from detrkit.models.heads.box import build_box_head, build_class_head, resize_class_head
from detrkit.models.heads.keypoint import KeypointHead, active_keypoint_mask, keypoint_class_logits
from detrkit.models.heads.mask import SegmentationHead
from detrkit.models.two_stage import Transformer, TransformerOutput, flatten_levels
from detrkit.ops.boxes import apply_box_delta
from detrkit.structures import DetectorOutput, MaskFactors

# dense logits (eval's final layer), factors (training, and eval's other layers when asked for), None
Masks = torch.Tensor | MaskFactors | None


class Detector(nn.Module):
    """Group DETR detector: `groups` query groups while training, the first one in eval.

    Attribute names follow the published RF-DETR checkpoints (`backbone.0`, `class_embed`, ...).
    A segmentation head, when given, adds `pred_masks` to every output layer. A keypoint head
    (with a KeypointTransformer) adds `pred_keypoints` and its keypoints' class-logit offsets.
    """

    def __init__(self, backbone: Backbone, transformer: Transformer, *, num_logits: int,
                 num_queries: int, groups: int, dim: int,
                 segmentation_head: SegmentationHead | None = None, keypoint_head: KeypointHead | None = None) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.groups = groups
        # (keypoint classes, max keypoints) schema of keypoint models; (0, 0) for the others
        schema = () if keypoint_head is None else keypoint_head.schema
        self.register_buffer("_kp_active_mask", active_keypoint_mask(schema))
        self.transformer = transformer
        self.class_embed = build_class_head(dim, num_logits)
        self.bbox_embed = build_box_head(dim)
        transformer.attach_encoder_heads(self.class_embed, self.bbox_embed, groups)
        self.segmentation_head = segmentation_head  # registered here: checkpoint key order
        self.refpoint_embed = nn.Embedding(num_queries * groups, 4)
        nn.init.zeros_(self.refpoint_embed.weight)
        self.query_feat = nn.Embedding(num_queries * groups, dim)
        self.backbone = nn.ModuleList([backbone])  # index 0 in checkpoint keys
        self.keypoint_embed = keypoint_head  # registered last: checkpoint key order

    @property
    def num_classes(self) -> int:
        return self.class_embed.out_features - 1

    def resize_class_heads(self, num_logits: int) -> None:
        """Give the class head and its per-group encoder copies `num_logits` outputs (rows tiled)."""
        if num_logits == self.class_embed.out_features:
            return
        self.class_embed = resize_class_head(self.class_embed, num_logits)
        copies = self.transformer.enc_out_class_embed
        self.transformer.enc_out_class_embed = nn.ModuleList(resize_class_head(h, num_logits) for h in copies)

    def forward(self, pixels: torch.Tensor, padding: torch.Tensor | None = None,
                every_mask_layer: bool | None = None) -> DetectorOutput:
        """pixels (B, C, H, W) normalised; padding (B, H, W) True on padded pixels, or None.

        every_mask_layer (segmentation models): masks for the auxiliary decoder layers and the
        encoder proposals too, which only losses read. Default: while training. In eval the
        final layer's masks are dense and the others, when asked for, factors."""
        groups = self.groups if self.training else 1
        rows = self.num_queries * groups
        features = self.backbone[0](pixels, padding)
        memory = flatten_levels(features.levels, features.masks, features.keypoint_levels)
        out = self.transformer(memory, self.query_feat.weight[:rows], self.refpoint_embed.weight[:rows], groups)
        layer_keypoints, enc_keypoints = self._keypoints(out)
        logits = self._with_keypoint_logits(self.class_embed(out.hidden), layer_keypoints)  # (layers, B, Q, C)
        enc_logits = self._with_keypoint_logits(out.enc_logits, enc_keypoints)
        boxes = apply_box_delta(self.bbox_embed(out.hidden), out.reference)  # (layers, B, Q, 4)
        every = self.training if every_mask_layer is None else every_mask_layer
        layer_masks, enc_masks = self._masks(features.levels[0], out, (pixels.shape[-2], pixels.shape[-1]), every)
        keypoints = [None] * len(logits) if layer_keypoints is None else list(layer_keypoints)
        aux = [DetectorOutput(logits[i], boxes[i], pred_masks=layer_masks[i], pred_keypoints=keypoints[i])
               for i in range(len(logits) - 1)]
        enc = DetectorOutput(enc_logits, out.enc_boxes, pred_masks=enc_masks, pred_keypoints=enc_keypoints)
        return DetectorOutput(logits[-1], boxes[-1], aux_outputs=aux, enc_outputs=enc, pred_masks=layer_masks[-1],
                              pred_keypoints=keypoints[-1])

    def _keypoints(self, out: TransformerOutput) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Decoded keypoints of every decoder layer (layers, B, Q, K', 8) and of the encoder
        proposals (B, G*k, K', 8); Nones without a keypoint head."""
        if self.keypoint_embed is None:
            return None, None
        return self.keypoint_embed.predict(out.keypoints, out.reference), out.enc_keypoints

    def _with_keypoint_logits(self, logits: torch.Tensor, keypoints: torch.Tensor | None) -> torch.Tensor:
        if keypoints is None:
            return logits
        return logits + keypoint_class_logits(keypoints, self._kp_active_mask, logits.shape[-1])

    def _masks(self, level: torch.Tensor, out: TransformerOutput, image_size: tuple[int, int], every_layer: bool
               ) -> tuple[list[Masks], Masks]:
        """Mask logits per decoder layer and for the encoder proposals: factored while training
        (losses sample them); in eval the final layer's dense. Nones where not asked for or
        without a segmentation head."""
        if self.segmentation_head is None:
            return [None] * len(out.hidden), None
        layers, encoder = self.segmentation_head(level, out.hidden, out.enc_features, image_size, every_layer)
        if not self.training:
            layers[-1] = layers[-1].dense()
        return layers, encoder
