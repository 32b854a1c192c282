"""Build a Detector from a ModelConfig (the only place model settings are read)."""

from __future__ import annotations

from detrkit.config import ModelConfig
from detrkit.models.backbone import Backbone
from detrkit.models.detector import Detector
from detrkit.models.heads.mask import SegmentationHead
from detrkit.models.projector import MultiScaleProjector
from detrkit.models.two_stage import Transformer
from detrkit.models.vit import DinoV2, WindowedDinov2, init_vit_weights

# Settings that describe variants this package does not build yet, with the feature they need.
_NOT_YET = {
    "use_grouppose_keypoints": "keypoint detection (use_grouppose_keypoints=True)",
    "backbone_lora": "DoRA fine-tuning of the encoder (backbone_lora=True)",
    "dual_projector": "a second projector for keypoint cross-attention (dual_projector=True)",
    "num_decoder_registers": "decoder register tokens (num_decoder_registers>0)",
}
_REQUIRED_TRUE = ("two_stage", "bbox_reparam", "lite_refpoint_refine")


def check_buildable(config: ModelConfig) -> None:
    """Raise NotImplementedError naming any requested feature this package cannot build."""
    for name, feature in _NOT_YET.items():
        if getattr(config, name):
            raise NotImplementedError(f"{feature} is not available in detrkit yet")
    for name in _REQUIRED_TRUE:
        if not getattr(config, name):
            raise NotImplementedError(f"{name}=False is not supported; every RF-DETR variant uses {name}=True")


def build_model(config: ModelConfig, drop_path: float = 0.0) -> Detector:
    """A randomly initialised Detector of the configured shape (weights load separately)."""
    check_buildable(config)
    vit = WindowedDinov2(
        in_channels=config.num_channels, width=config.encoder_width_resolved,
        heads=config.encoder_heads_resolved, patch_size=config.patch_size,
        grid=config.positional_encoding_size, num_windows=config.num_windows,
        out_feature_indexes=config.out_feature_indexes, registers=config.num_register_tokens,
        drop_path=drop_path, gradient_checkpointing=config.gradient_checkpointing)
    init_vit_weights(vit)
    if config.freeze_encoder:
        vit.requires_grad_(False)
    projector = MultiScaleProjector(config.encoder_width_resolved, len(config.out_feature_indexes),
                                    config.hidden_dim, config.projector_scale, config.layer_norm)
    transformer = Transformer(
        dim=config.hidden_dim, num_layers=config.dec_layers, sa_heads=config.sa_nheads,
        ca_heads=config.ca_nheads, levels=len(config.projector_scale), points=config.dec_n_points,
        ffn_dim=config.dim_feedforward, groups=config.group_detr, num_queries=config.num_queries)
    segmentation_head = (SegmentationHead(config.hidden_dim, config.dec_layers, config.mask_downsample_ratio)
                         if config.segmentation_head else None)
    return Detector(Backbone(DinoV2(vit), projector), transformer, num_logits=config.num_classes + 1,
                    num_queries=config.num_queries, groups=config.group_detr, dim=config.hidden_dim,
                    segmentation_head=segmentation_head)
