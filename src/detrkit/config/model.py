"""ModelConfig: the detector's architecture, weights and runtime switches; read only by builders."""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field, field_validator, model_validator

from detrkit.config.base import DeviceStr, StrictConfig, default_device, path_string
from detrkit.config.messages import nearest_multiples

EncoderName = Literal["dinov2_windowed_small", "dinov2_windowed_base", "dinov2_registers_windowed_small"]
ProjectorLevel = Literal["P3", "P4", "P5"]

# width, heads of each DINOv2 size; every size has 12 blocks in the published models.
ENCODER_SIZES = {"small": (384, 6), "base": (768, 12), "large": (1024, 16)}

# Fields whose change makes a published checkpoint load only partly (spec 1.3).
_ARCHITECTURE_FIELDS = (
    "encoder", "hidden_dim", "dec_layers", "num_windows", "sa_nheads", "ca_nheads", "dec_n_points",
    "out_feature_indexes", "projector_scale", "bbox_reparam", "lite_refpoint_refine", "layer_norm",
    "two_stage", "patch_size", "segmentation_head", "num_channels",
)


# What the training precision is asked to be (spec 12.7); resolved per device by training.accel.precision
AmpDtype = Literal["auto", "bf16", "fp16", "fp32", "fp8"]
InferenceDtype = Literal["fp32", "fp16", "bf16"]


class PretrainWeightsCompatibilityWarning(UserWarning):
    """The configured model differs from what its published weights were trained as."""


class ModelConfig(StrictConfig):
    """Architecture, weights and runtime switches of one detector.

    The defaults describe RF-DETR Nano; `detrkit.variants` holds the published presets. The
    `encoder_layers`, `encoder_width`, `encoder_heads` and `dim_feedforward` fields exist so that
    tests and demos can build small custom models; `None` means "as the encoder name says".
    """

    encoder: EncoderName = "dinov2_windowed_small"
    encoder_layers: int | None = Field(None, ge=1)
    encoder_width: int | None = Field(None, ge=8)
    encoder_heads: int | None = Field(None, ge=1)
    out_feature_indexes: list[int] = [3, 6, 9, 12]
    dec_layers: int = Field(2, ge=1)
    two_stage: bool = True
    projector_scale: list[ProjectorLevel] = ["P4"]
    hidden_dim: int = Field(256, ge=8)
    dim_feedforward: int = Field(2048, ge=1)
    patch_size: int = Field(16, ge=1)
    num_windows: int = Field(2, ge=1)
    sa_nheads: int = Field(8, ge=1)
    ca_nheads: int = Field(16, ge=1)
    dec_n_points: int = Field(2, ge=1)
    num_queries: int = Field(300, ge=1)
    num_select: int = Field(300, ge=1)
    postprocess_trace_alpha: float = Field(0.2, ge=0)
    bbox_reparam: bool = True
    lite_refpoint_refine: bool = True
    layer_norm: bool = True
    amp: bool = True  # deprecated: False means fp32 training when TrainConfig.amp_dtype is left at "auto"
    num_channels: int = Field(3, ge=1)
    num_classes: int = Field(90, ge=1)
    pretrain_weights: str | None = None
    device: DeviceStr = Field(default_factory=default_device)
    resolution: int = Field(384, ge=1)
    group_detr: int = Field(13, ge=1)
    gradient_checkpointing: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    fused_optimizer: bool = True
    inference_dtype: InferenceDtype = "fp32"  # predict() on CUDA: "fp16"/"bf16" run under autocast
    positional_encoding_size: int = Field(24, ge=1)
    ia_bce_loss: bool = True
    segmentation_head: bool = False
    use_grouppose_keypoints: bool = False
    keypoint_cross_attn: bool = True
    inter_instance_kp_attn: bool = False
    grouppose_keypoint_dim_downscale: int = Field(1, ge=1)
    dual_projector: bool = False
    dual_projector_kp_only: bool = False
    num_keypoints_per_class: list[int] = []
    num_decoder_registers: int = Field(0, ge=0)
    mask_downsample_ratio: int = Field(4, ge=1)
    backbone_lora: bool = False
    freeze_encoder: bool = False
    license: str = "Apache-2.0"
    model_name: str | None = None

    @field_validator("pretrain_weights", mode="before")
    @classmethod
    def _weights_path(cls, value: object) -> object:
        return path_string(value)

    @field_validator("out_feature_indexes")
    @classmethod
    def _check_taps(cls, value: list[int]) -> list[int]:
        if not value or sorted(set(value)) != value or value[0] < 1:
            raise ValueError(f"out_feature_indexes must be ascending stage numbers >= 1, got {value}")
        return value

    @field_validator("projector_scale")
    @classmethod
    def _check_levels(cls, value: list[str]) -> list[str]:
        if not value or sorted(set(value)) != value:
            raise ValueError(f"projector_scale must be an ascending subset of P3/P4/P5, got {value}")
        return value

    @model_validator(mode="after")
    def _derive_and_check(self) -> "ModelConfig":
        fields = self.model_fields_set
        default = type(self).model_fields
        default_res, default_patch = default["resolution"].default, default["patch_size"].default
        if ("resolution" in fields and "positional_encoding_size" not in fields
                and default["positional_encoding_size"].default == default_res // default_patch):
            # Bypass validate_assignment to avoid re-entering this validator.
            object.__setattr__(self, "positional_encoding_size", self.resolution // self.patch_size)
        block = self.patch_size * self.num_windows
        if self.resolution % block:
            nearest = " or ".join(str(side) for side in nearest_multiples(self.resolution, block))
            raise ValueError(f"resolution={self.resolution} must be divisible by patch_size*num_windows={block}; "
                             f"nearest valid: {nearest}")
        if self.encoder_width_resolved % self.encoder_heads_resolved:
            raise ValueError(f"encoder width {self.encoder_width_resolved} is not divisible by "
                             f"{self.encoder_heads_resolved} heads")
        if self.out_feature_indexes[-1] > self.encoder_layers_resolved:
            raise ValueError(f"out_feature_indexes {self.out_feature_indexes} tap past the encoder's "
                             f"{self.encoder_layers_resolved} blocks")
        for name, width, heads in (("sa_nheads", self.hidden_dim, self.sa_nheads),
                                   ("ca_nheads", self.hidden_dim, self.ca_nheads)):
            if width % heads:
                raise ValueError(f"hidden_dim={width} is not divisible by {name}={heads}")
        self._warn_if_unlike_published(fields)
        return self

    def _warn_if_unlike_published(self, fields: set[str]) -> None:
        default = type(self).model_fields
        published = default["pretrain_weights"].default
        if published is None:
            return
        if "pretrain_weights" in fields and self.pretrain_weights is None:
            warnings.warn(f"pretrain_weights=None: {type(self).__name__} starts from random weights instead of "
                          f"{published}", PretrainWeightsCompatibilityWarning, stacklevel=4)
            return
        if self.pretrain_weights != published:
            return
        changed = [f for f in _ARCHITECTURE_FIELDS if f in fields and getattr(self, f) != default[f].default]
        changed += [f for f in ("num_queries", "group_detr") if getattr(self, f) > default[f].default]
        if self.segmentation_head and self.mask_downsample_ratio != default["mask_downsample_ratio"].default:
            changed.append("mask_downsample_ratio")
        if changed:
            warnings.warn(f"{', '.join(changed)} differ from the published {published}; its weights will load "
                          f"only partly", PretrainWeightsCompatibilityWarning, stacklevel=4)

    @property
    def encoder_width_resolved(self) -> int:
        return self.encoder_width or ENCODER_SIZES[self.encoder.rsplit("_", 1)[1]][0]

    @property
    def encoder_heads_resolved(self) -> int:
        return self.encoder_heads or ENCODER_SIZES[self.encoder.rsplit("_", 1)[1]][1]

    @property
    def encoder_layers_resolved(self) -> int:
        return self.encoder_layers or 12

    @property
    def num_register_tokens(self) -> int:
        return 4 if "registers" in self.encoder.split("_") else 0

    @property
    def block_size(self) -> int:
        """Input sides must be multiples of this (patch size times windows per side)."""
        return self.patch_size * self.num_windows
