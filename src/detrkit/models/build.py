"""Build a Detector from a ModelConfig (the only place model settings are read)."""

from __future__ import annotations

from detrkit.config import ModelConfig
from detrkit.models.backbone import Backbone
from detrkit.models.decoder import Decoder, DecoderLayer
from detrkit.models.detector import Detector
from detrkit.models.heads.keypoint import KeypointHead
from detrkit.models.heads.mask import SegmentationHead
from detrkit.models.keypoint_decoder import KeypointDecoder, KeypointDecoderLayer
from detrkit.models.keypoint_transformer import KeypointTransformer
from detrkit.models.projector import MultiScaleProjector
from detrkit.models.two_stage import Transformer
from detrkit.models.vit import DinoV2, WindowedDinov2, init_vit_weights

# Settings that describe variants this package does not build yet, with the feature they need.
_NOT_YET = {
    "backbone_lora": "DoRA fine-tuning of the encoder (backbone_lora=True)",
    "num_decoder_registers": "decoder register tokens (num_decoder_registers>0)",
}
_REQUIRED_TRUE = ("two_stage", "bbox_reparam", "lite_refpoint_refine")


def check_buildable(config: ModelConfig) -> None:
    """Raise NotImplementedError naming any requested feature this package cannot build, and
    ValueError for keypoint settings that do not fit together."""
    for name, feature in _NOT_YET.items():
        if getattr(config, name):
            raise NotImplementedError(f"{feature} is not available in detrkit yet")
    for name in _REQUIRED_TRUE:
        if not getattr(config, name):
            raise NotImplementedError(f"{name}=False is not supported; every RF-DETR variant uses {name}=True")
    if config.dual_projector and not (config.use_grouppose_keypoints and config.dual_projector_kp_only):
        raise NotImplementedError("a second projector feeding the instance decoder is not available in detrkit "
                                  "yet; dual_projector=True needs use_grouppose_keypoints=True and "
                                  "dual_projector_kp_only=True")
    if config.use_grouppose_keypoints:
        _check_keypoint_schema(config)


def _check_keypoint_schema(config: ModelConfig) -> None:
    schema = config.num_keypoints_per_class
    if not schema or sum(schema) == 0 or min(schema) < 0:
        raise ValueError(f"use_grouppose_keypoints=True needs num_keypoints_per_class with keypoints, got {schema}")
    if len(schema) > config.num_classes:
        raise ValueError(f"num_keypoints_per_class has {len(schema)} classes but num_classes={config.num_classes}; "
                         "keypoint class c raises class logit c, so there cannot be more keypoint classes")
    if config.hidden_dim % config.grouppose_keypoint_dim_downscale:
        raise ValueError(f"hidden_dim={config.hidden_dim} is not divisible by "
                         f"grouppose_keypoint_dim_downscale={config.grouppose_keypoint_dim_downscale}")


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
    projector = build_projector(config)
    second_projector = build_projector(config) if config.dual_projector else None
    keypoint_head = None
    if config.use_grouppose_keypoints:
        keypoint_head = KeypointHead(config.hidden_dim // config.grouppose_keypoint_dim_downscale,
                                     config.num_keypoints_per_class)
    transformer = build_transformer(config, keypoint_head)
    segmentation_head = (SegmentationHead(config.hidden_dim, config.dec_layers, config.mask_downsample_ratio)
                         if config.segmentation_head else None)
    return Detector(Backbone(DinoV2(vit), projector, second_projector), transformer,
                    num_logits=config.num_classes + 1, num_queries=config.num_queries, groups=config.group_detr,
                    dim=config.hidden_dim, segmentation_head=segmentation_head, keypoint_head=keypoint_head)


def build_projector(config: ModelConfig) -> MultiScaleProjector:
    return MultiScaleProjector(config.encoder_width_resolved, len(config.out_feature_indexes),
                               config.hidden_dim, config.projector_scale, config.layer_norm)


def build_transformer(config: ModelConfig, keypoint_head: KeypointHead | None = None) -> Transformer:
    """The two-stage transformer; with a keypoint head, the keypoint transformer and decoder."""
    layer_args = (config.hidden_dim, config.sa_nheads, config.ca_nheads, len(config.projector_scale),
                  config.dec_n_points, config.dim_feedforward)
    if keypoint_head is None:
        decoder = Decoder(DecoderLayer(*layer_args), config.dec_layers)
        return Transformer(decoder, groups=config.group_detr, num_queries=config.num_queries)
    layer = KeypointDecoderLayer(*layer_args, downscale=config.grouppose_keypoint_dim_downscale,
                                 cross_attn=config.keypoint_cross_attn, inter_instance=config.inter_instance_kp_attn)
    decoder = KeypointDecoder(layer, config.dec_layers, config.num_keypoints_per_class)
    return KeypointTransformer(decoder, keypoint_head, groups=config.group_detr, num_queries=config.num_queries)
