"""The augmentation backend registry: which per-sample transform and per-batch step a run uses."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torchvision.transforms import v2

from detrkit.config import TrainConfig
from detrkit.datasets.detection import SampleTransform
from detrkit.datasets.transforms import build_train_resize, build_train_transform
from detrkit.structures import Batch

BatchAugment = Callable[[Batch], Batch]


class Augmentation(Protocol):
    """What every backend provides: the per-sample transform of the training split (run in the
    loader workers) and the per-batch step on the training device (None when there is none)."""

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool) -> SampleTransform: ...

    def batch_augment(self) -> BatchAugment | None: ...


class TorchvisionAugmentation:
    """The default pipeline (resize branches, horizontal flip, normalise); aug_config={} drops the flip."""

    def __init__(self, aug_config: dict[str, dict] | None) -> None:
        if aug_config:
            warnings.warn(f"augmentation_backend='torchvision' runs the default pipeline; aug_config "
                          f"{sorted(aug_config)} is ignored", UserWarning, stacklevel=2)
        self.flip_p = 0.0 if aug_config == {} else 0.5

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool) -> SampleTransform:
        return build_train_transform(scales, square, scale_jitter, self.flip_p)

    def batch_augment(self) -> BatchAugment | None:
        return None


class AlbumentationsAugmentation:
    """The aug_config by Albumentations, per sample in the loader workers, after the resize stage."""

    def __init__(self, aug_config: dict[str, dict]) -> None:
        from detrkit.datasets.albumentations import build_compose

        build_compose(aug_config)  # fail on a bad name or keyword now, not in a worker
        self.aug_config = aug_config

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool) -> SampleTransform:
        from detrkit.datasets.albumentations import AlbumentationsTransform

        return AlbumentationsTransform(build_train_resize(scales, square, scale_jitter), self.aug_config)

    def batch_augment(self) -> BatchAugment | None:
        return None


class KorniaAugmentation:
    """Loader workers only resize (uint8 out, a quarter of the float bytes to move); the aug_config
    and the normalisation run per batch on the training device."""

    def __init__(self, aug_config: dict[str, dict]) -> None:
        from detrkit.datasets.kornia import KorniaAugment

        self.augment = KorniaAugment(aug_config)

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool) -> SampleTransform:
        return v2.Compose([build_train_resize(scales, square, scale_jitter)])

    def batch_augment(self) -> BatchAugment | None:
        return self.augment


# augmentation_backend -> class; "auto" is resolved to one of these first
BACKENDS = {
    "torchvision": TorchvisionAugmentation,
    "cpu": AlbumentationsAugmentation,
    "albumentations": AlbumentationsAugmentation,
    "kornia": KorniaAugmentation,
}


def resolve_backend(name: str, aug_config: dict[str, dict] | None, cuda: bool) -> str:
    """The registry key for a run: the default pipeline without a (non-empty) aug_config, Kornia
    for "auto" when training on CUDA, else Albumentations for "auto"."""
    if not aug_config:
        return "torchvision"
    if name == "auto":
        return "kornia" if cuda else "albumentations"
    if name not in BACKENDS:
        raise ValueError(f"augmentation_backend {name!r} is not one of auto, {', '.join(BACKENDS)}")
    return name


def build_augmentation(train_config: TrainConfig) -> Augmentation:
    """The backend object the config selects, with its aug_config checked (ValueError naming a bad
    transform; ImportError naming detrkit[augment] when the package is missing)."""
    device = train_config.device or train_config.accelerator
    cuda = torch.cuda.is_available() and device.split(":")[0] in ("auto", "cuda", "gpu")
    name = resolve_backend(train_config.augmentation_backend, train_config.aug_config, cuda)
    return BACKENDS[name](train_config.aug_config)
