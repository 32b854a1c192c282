"""The published RF-DETR detection presets: config defaults per class, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from detrkit.config import ModelConfig
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


class RFDETRNano(RFDETR):
    config_class = RFDETRNanoConfig


class RFDETRSmall(RFDETR):
    config_class = RFDETRSmallConfig


class RFDETRMedium(RFDETR):
    config_class = RFDETRMediumConfig


class RFDETRLarge(RFDETR):
    config_class = RFDETRLargeConfig


# name -> class, in the order a checkpoint's weight-file name is matched against them
VARIANTS: dict[str, type[RFDETR]] = {
    "large": RFDETRLarge, "medium": RFDETRMedium, "small": RFDETRSmall, "nano": RFDETRNano,
}


def model_class_for(checkpoint: "Checkpoint", path: str | Path) -> type[RFDETR]:
    """The class a checkpoint was saved from: its model_name, else its weights' or file's name."""
    by_class_name = {cls.__name__: cls for cls in VARIANTS.values()}
    if checkpoint.model_name in by_class_name:
        return by_class_name[checkpoint.model_name]
    for hint in (str(checkpoint.args.get("pretrain_weights") or ""), Path(path).name):
        for name, cls in VARIANTS.items():
            if name in hint.lower():
                return cls
    return RFDETR
