"""The published RF-DETR detection, segmentation and keypoint presets: config defaults per class, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from detrkit.config import KeypointTrainConfig, ModelConfig, SegmentationTrainConfig
from detrkit.detr import RFDETR

if TYPE_CHECKING:
    from detrkit.models.weights import Checkpoint


class RFDETRNanoConfig(ModelConfig):
    dec_layers: int = 2
    resolution: int = 384
    positional_encoding_size: int = 24
    pretrain_weights: str | None = "rf-detr-nano.pth"


class RFDETRSmallConfig(ModelConfig):
    dec_layers: int = 3
    resolution: int = 512
    positional_encoding_size: int = 32
    pretrain_weights: str | None = "rf-detr-small.pth"


class RFDETRMediumConfig(ModelConfig):
    dec_layers: int = 4
    resolution: int = 576
    positional_encoding_size: int = 36
    pretrain_weights: str | None = "rf-detr-medium.pth"


class RFDETRLargeConfig(ModelConfig):
    dec_layers: int = 4
    resolution: int = 704
    positional_encoding_size: int = 44
    pretrain_weights: str | None = "rf-detr-large-2026.pth"


class _SegmentationConfig(ModelConfig):
    """What every published segmentation preset shares."""

    segmentation_head: bool = True
    patch_size: int = 12


class RFDETRSegNanoConfig(_SegmentationConfig):
    num_windows: int = 1
    dec_layers: int = 4
    resolution: int = 312
    positional_encoding_size: int = 26
    num_queries: int = 100
    num_select: int = 100
    pretrain_weights: str | None = "rf-detr-seg-nano.pt"


class RFDETRSegSmallConfig(_SegmentationConfig):
    dec_layers: int = 4
    resolution: int = 384
    positional_encoding_size: int = 32
    num_queries: int = 100
    num_select: int = 100
    pretrain_weights: str | None = "rf-detr-seg-small.pt"


class RFDETRSegMediumConfig(_SegmentationConfig):
    dec_layers: int = 5
    resolution: int = 432
    positional_encoding_size: int = 36
    num_queries: int = 200
    num_select: int = 200
    pretrain_weights: str | None = "rf-detr-seg-medium.pt"


class RFDETRSegLargeConfig(_SegmentationConfig):
    dec_layers: int = 5
    resolution: int = 504
    positional_encoding_size: int = 42
    num_queries: int = 200
    num_select: int = 200
    pretrain_weights: str | None = "rf-detr-seg-large.pt"


class RFDETRSegXLargeConfig(_SegmentationConfig):
    dec_layers: int = 6
    resolution: int = 624
    positional_encoding_size: int = 52
    pretrain_weights: str | None = "rf-detr-seg-xlarge.pt"


class RFDETRSeg2XLargeConfig(_SegmentationConfig):
    dec_layers: int = 6
    resolution: int = 768
    positional_encoding_size: int = 64
    pretrain_weights: str | None = "rf-detr-seg-xxlarge.pt"


class RFDETRKeypointPreviewConfig(ModelConfig):
    """GroupPose keypoints (COCO person schema) beside detection; keypoints cross-attend a second projector."""

    use_grouppose_keypoints: bool = True
    dual_projector: bool = True
    dual_projector_kp_only: bool = True
    num_keypoints_per_class: list[int] = [17]
    patch_size: int = 12
    dec_layers: int = 4
    resolution: int = 576
    positional_encoding_size: int = 48
    num_queries: int = 100
    num_select: int = 100
    pretrain_weights: str | None = "rf-detr-keypoint-preview-xlarge.pth"


class RFDETRNano(RFDETR):
    config_class = RFDETRNanoConfig


class RFDETRSmall(RFDETR):
    config_class = RFDETRSmallConfig


class RFDETRMedium(RFDETR):
    config_class = RFDETRMediumConfig


class RFDETRLarge(RFDETR):
    config_class = RFDETRLargeConfig


class RFDETRSegmentation(RFDETR):
    """Instance segmentation presets: trained with the mask losses of SegmentationTrainConfig."""

    train_config_class = SegmentationTrainConfig


class RFDETRSegNano(RFDETRSegmentation):
    config_class = RFDETRSegNanoConfig


class RFDETRSegSmall(RFDETRSegmentation):
    config_class = RFDETRSegSmallConfig


class RFDETRSegMedium(RFDETRSegmentation):
    config_class = RFDETRSegMediumConfig


class RFDETRSegLarge(RFDETRSegmentation):
    config_class = RFDETRSegLargeConfig


class RFDETRSegXLarge(RFDETRSegmentation):
    config_class = RFDETRSegXLargeConfig


class RFDETRSeg2XLarge(RFDETRSegmentation):
    config_class = RFDETRSeg2XLargeConfig


class RFDETRKeypointPreview(RFDETR):
    """Keypoint detection preset: trained with the keypoint losses of KeypointTrainConfig."""

    config_class = RFDETRKeypointPreviewConfig
    train_config_class = KeypointTrainConfig


# name -> class, in the order a checkpoint's weight-file name is matched against them: a name
# that contains another ("seg-nano" contains "nano", "keypoint-preview-xlarge" contains "large") comes first
VARIANTS: dict[str, type[RFDETR]] = {
    "keypoint-preview": RFDETRKeypointPreview,
    "seg-2xlarge": RFDETRSeg2XLarge, "seg-xlarge": RFDETRSegXLarge, "seg-large": RFDETRSegLarge,
    "seg-medium": RFDETRSegMedium, "seg-small": RFDETRSegSmall, "seg-nano": RFDETRSegNano,
    "large": RFDETRLarge, "medium": RFDETRMedium, "small": RFDETRSmall, "nano": RFDETRNano,
}
# names that published weight files use besides the registry's, matched before it
_FILE_NAMES: dict[str, type[RFDETR]] = {"seg-xxlarge": RFDETRSeg2XLarge}
_KEYPOINT_HEAD_PREFIX = "keypoint_embed."


def model_class_for(checkpoint: "Checkpoint", path: str | Path) -> type[RFDETR]:
    """The class a checkpoint was saved from: its model_name, else keypoint weights, else its
    weights' or file's name."""
    by_class_name = {cls.__name__: cls for cls in VARIANTS.values()}
    if checkpoint.model_name in by_class_name:
        return by_class_name[checkpoint.model_name]
    if any(key.startswith(_KEYPOINT_HEAD_PREFIX) for key in checkpoint.weights):
        return RFDETRKeypointPreview
    for hint in (str(checkpoint.args.get("pretrain_weights") or ""), Path(path).name):
        for name, cls in {**_FILE_NAMES, **VARIANTS}.items():
            if name in hint.lower():
                return cls
    return RFDETR
