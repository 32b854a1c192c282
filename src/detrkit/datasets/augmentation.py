"""The augmentation backend registry: which per-sample transform and per-batch step a run uses."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torchvision.transforms import v2

from detrkit.config import TrainConfig
from detrkit.datasets.detection import SampleTransform
from detrkit.datasets.keypoint_schema import KeypointFlip, pairs_from_flat
from detrkit.datasets.transforms import build_train_resize, build_train_transform
from detrkit.structures import Batch

BatchAugment = Callable[[Batch], Batch]


class Augmentation(Protocol):
    """What every backend provides: the per-sample transform of the training split (run in the
    loader workers), the per-batch step on the training device (None when there is none), and
    whether either can mirror an image. Keypoint data needs a flip map (`keypoint_flip`, given
    per call or at construction) to relabel left and right slots when an image is mirrored."""

    mirrors: bool

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool,
                        keypoint_flip: KeypointFlip | None = None) -> SampleTransform: ...

    def batch_augment(self) -> BatchAugment | None: ...


class TorchvisionAugmentation:
    """The built-in pipeline (resize branches, horizontal flip, normalise) of a recipe in
    transforms.RECIPES; aug_config={} drops the flip."""

    def __init__(self, aug_config: dict[str, dict] | None, keypoint_flip: KeypointFlip | None = None,
                 recipe: str = "default") -> None:
        if aug_config:
            warnings.warn(f"augmentation_backend='torchvision' runs the built-in pipeline; aug_config "
                          f"{sorted(aug_config)} is ignored", UserWarning, stacklevel=2)
        self.flip_p = 0.0 if aug_config == {} else 0.5
        self.mirrors = self.flip_p > 0
        self.keypoint_flip = keypoint_flip
        self.recipe = recipe

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool,
                        keypoint_flip: KeypointFlip | None = None) -> SampleTransform:
        return build_train_transform(scales, square, scale_jitter, self.flip_p, keypoint_flip or self.keypoint_flip,
                                     self.recipe)

    def batch_augment(self) -> BatchAugment | None:
        return None


class AlbumentationsAugmentation:
    """The aug_config by Albumentations, per sample in the loader workers, after the resize stage."""

    def __init__(self, aug_config: dict[str, dict], keypoint_flip: KeypointFlip | None = None,
                 recipe: str = "default") -> None:
        from detrkit.datasets.albumentations import MIRRORING, build_compose

        build_compose(aug_config)  # fail on a bad name or keyword now, not in a worker
        self.aug_config = aug_config
        self.mirrors = bool(MIRRORING & set(aug_config))
        self.keypoint_flip = keypoint_flip
        self.recipe = recipe

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool,
                        keypoint_flip: KeypointFlip | None = None) -> SampleTransform:
        from detrkit.datasets.albumentations import AlbumentationsTransform

        return AlbumentationsTransform(build_train_resize(scales, square, scale_jitter, self.recipe), self.aug_config,
                                       keypoint_flip or self.keypoint_flip)

    def batch_augment(self) -> BatchAugment | None:
        return None


class KorniaAugmentation:
    """Loader workers only resize (uint8 out, a quarter of the float bytes to move); the aug_config
    and the normalisation run per batch on the training device."""

    def __init__(self, aug_config: dict[str, dict], keypoint_flip: KeypointFlip | None = None,
                 recipe: str = "default") -> None:
        from detrkit.datasets.kornia import MIRRORING, KorniaAugment

        self.augment = KorniaAugment(aug_config, keypoint_flip)
        self.mirrors = bool(MIRRORING & set(aug_config))
        self.recipe = recipe

    def train_transform(self, scales: Sequence[int], square: bool, scale_jitter: bool,
                        keypoint_flip: KeypointFlip | None = None) -> SampleTransform:
        """The resize stage; the batch step mirrors, with the flip map given at construction."""
        return v2.Compose([build_train_resize(scales, square, scale_jitter, self.recipe)])

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
    """The registry key for a run: the built-in pipeline without a (non-empty) aug_config, Kornia
    for "auto" when training on CUDA, else Albumentations for "auto"."""
    if name != "auto" and name not in BACKENDS:
        raise ValueError(f"augmentation_backend {name!r} is not one of auto, {', '.join(BACKENDS)}")
    if not aug_config:
        return "torchvision"
    if name == "auto":
        return "kornia" if cuda else "albumentations"
    return name


def training_recipe(name: str) -> str:
    """The resize recipe (transforms.RECIPES): spec 12.8's when the torchvision backend is named,
    the default one for every other backend, whichever packages are installed."""
    return "torchvision" if name == "torchvision" else "default"


def build_augmentation(train_config: TrainConfig, keypoint_flip: KeypointFlip | None = None) -> Augmentation:
    """The backend object the config selects, with its aug_config checked (ValueError naming a bad
    transform; ImportError naming detrkit[augment] when the package is missing). The keypoint flip
    map defaults to TrainConfig.keypoint_flip_pairs when those are given; pass the data set's
    (DatasetSplits.keypoint_flip) so that a batch step can relabel mirrored keypoints too."""
    device = train_config.device or train_config.accelerator
    cuda = torch.cuda.is_available() and device.split(":")[0] in ("auto", "cuda", "gpu")
    name = resolve_backend(train_config.augmentation_backend, train_config.aug_config, cuda)
    if keypoint_flip is None and train_config.keypoint_flip_pairs:
        keypoint_flip = KeypointFlip(pairs_from_flat(train_config.keypoint_flip_pairs, None,
                                                     "TrainConfig.keypoint_flip_pairs"))
    return BACKENDS[name](train_config.aug_config, keypoint_flip, training_recipe(train_config.augmentation_backend))
