"""The default torchvision augmentation pipeline (spec 12.8) and its multi-scale sizes (12.9)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.datasets.keypoint_schema import KeypointFlip
from detrkit.datasets.keypoints import MirrorFlip, mark_sample
from detrkit.structures import Batch

CROP_SHORT_SIDES = (400, 500, 600)  # branch B resizes the shortest side to one of these first
CROP_SIDE_RANGE = (384, 600)  # then crops a square with a side in this range
MAX_LONG_SIDE = 1333  # aspect-keeping resizes cap the long side here
SCALE_OFFSETS = {True: range(-5, 6), False: range(-3, 5)}  # by expanded_scales


class RandomSquareCrop(v2.Transform):
    """Crop a square at a uniform position; side uniform in [min(low, m), m], m = min(high, H, W).
    Boxes are translated and clamped; the dataset drops the ones left empty. Keypoints are
    translated; `mark_sample` after it zeroes those left outside."""

    def __init__(self, low: int = CROP_SIDE_RANGE[0], high: int = CROP_SIDE_RANGE[1]) -> None:
        super().__init__()
        self.low, self.high = low, high

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = next(TF.get_size(x) for x in flat_inputs if isinstance(x, tv_tensors.Image))
        largest = min(self.high, height, width)
        side = int(torch.randint(min(self.low, largest), largest + 1, ()))
        top = int(torch.randint(0, height - side + 1, ()))
        left = int(torch.randint(0, width - side + 1, ()))
        return {"top": top, "left": left, "height": side, "width": side}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(TF.crop, inpt, **params)


class RandomClippedCrop(RandomSquareCrop):
    """Crop a window at a uniform position: a side uniform in [low, high], clipped to the image's
    height for the window's height and to its width for its width, so the window is often the
    whole short side and, on a non-square image, not square (the window Albumentations'
    RandomSizedCrop samples in the reference's default recipe). Boxes as RandomSquareCrop."""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = next(TF.get_size(x) for x in flat_inputs if isinstance(x, tv_tensors.Image))
        side = int(torch.randint(self.low, self.high + 1, ()))
        crop_height, crop_width = min(side, height), min(side, width)
        top = int(torch.randint(0, height - crop_height + 1, ()))
        left = int(torch.randint(0, width - crop_width + 1, ()))
        return {"top": top, "left": left, "height": crop_height, "width": crop_width}


# The training recipes (the resize stage). "default": branch B's window as RandomClippedCrop, the
# training resizes without antialiasing, B's crop resized to (s, s); "torchvision": spec 12.8's
# steps, a square window (RandomSquareCrop) and antialiased resizes. Chosen by measurement
# (docs/benchmarks.md, issue 26): the default learns faster.
RECIPES = ("default", "torchvision")


def build_train_transform(scales: Sequence[int], square: bool = True, scale_jitter: bool = True,
                          flip_p: float = 0.5, keypoint_flip: KeypointFlip | None = None,
                          recipe: str = "default") -> v2.Compose:
    """Resize to a random scale (branch A), or with `scale_jitter` a fair coin's choice between A
    and B = shortest side to 400/500/600, random crop, resize; then flip and normalise.
    `square` resizes to (s, s); otherwise the shortest side becomes s (long side <= 1333). The
    flip swaps keypoint slots by `keypoint_flip` (needed when the data has keypoints)."""
    resize = build_train_resize(scales, square, scale_jitter, recipe)
    return v2.Compose([resize, MirrorFlip(flip_p, keypoint_flip), *_normalise()])


def build_train_resize(scales: Sequence[int], square: bool = True, scale_jitter: bool = True,
                       recipe: str = "default") -> v2.Transform:
    """The resize stage of the training pipeline alone (branch A, or A or B with `scale_jitter`)
    of a recipe in RECIPES; the augmentation backends run their own stack after it."""
    if recipe not in RECIPES:
        raise ValueError(f"training recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    antialias = recipe == "torchvision"
    resize = _resize_to_scale(scales, square, antialias)
    if scale_jitter:
        window = RandomSquareCrop() if recipe == "torchvision" else RandomClippedCrop()
        crop = v2.Compose([v2.RandomShortestSize(list(CROP_SHORT_SIDES), antialias=antialias),
                           window, mark_sample, _resize_to_scale(scales, square or recipe == "default", antialias)])
        resize = v2.RandomChoice([resize, crop])
    return resize


def build_eval_transform(resolution: int, square: bool = True) -> v2.Compose:
    """Resize to (resolution, resolution), or shortest side = resolution (long <= 1333); normalise."""
    if square:
        resize = v2.Resize((resolution, resolution), antialias=True)
    else:
        resize = v2.Resize(resolution, max_size=MAX_LONG_SIDE, antialias=True)
    return v2.Compose([resize, *_normalise()])


def _resize_to_scale(scales: Sequence[int], square: bool, antialias: bool = True) -> v2.Transform:
    if not scales or any(s < 1 for s in scales):
        raise ValueError(f"scales must be positive sizes, got {list(scales)}")
    if square:
        return v2.RandomChoice([v2.Resize((s, s), antialias=antialias) for s in scales])
    return v2.RandomShortestSize(list(scales), max_size=MAX_LONG_SIDE, antialias=antialias)


def _normalise() -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]


def multi_scale_sizes(resolution: int, block: int, expanded: bool = True) -> list[int]:
    """Training sides: multiples of `block` around `resolution` (offsets -5..5 expanded, else
    -3..4), keeping those >= 2 * block."""
    base = resolution // block
    return [(base + offset) * block for offset in SCALE_OFFSETS[expanded] if base + offset >= 2]


def sample_scales(mode: str, resolution: int, block: int, expanded: bool = True) -> list[int]:
    """The sides the dataset resizes to: the largest training scale for "per-batch" (the step
    resizes the batch later), all of them for "per-sample", the resolution for "off"."""
    if mode == "off":
        return [resolution]
    scales = multi_scale_sizes(resolution, block, expanded)
    if mode == "per-batch":
        return [max(scales)]
    if mode == "per-sample":
        return scales
    raise ValueError(f"multi_scale must be 'off', 'per-batch' or 'per-sample', got {mode!r}")


def batch_scale(step: int, scales: Sequence[int]) -> int:
    """The square side of optimizer step `step`; the same for every micro-batch of that step."""
    return random.Random(step).choice(scales)


def resize_batch(batch: Batch, size: int) -> Batch:
    """Resize the padded batch to (size, size): pixels bilinear without antialias, padding mask
    nearest; normalised boxes are unchanged, each target's `size` follows its content and its
    instance masks (if any) are resized to that size, nearest."""
    pixels = F.interpolate(batch.pixels, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    padding = None
    if batch.padding is not None:
        padding = F.interpolate(batch.padding[:, None].float(), size=(size, size), mode="nearest")[:, 0].bool()
    height, width = batch.pixels.shape[-2:]
    targets = []
    for target in batch.targets:
        content = (round(target.size[0] * size / height), round(target.size[1] * size / width))
        masks = None if target.masks is None else resize_masks(target.masks, content)
        targets.append(replace(target, size=content, masks=masks))
    return Batch(pixels, padding, targets)


def resize_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, h, w) bool masks -> (N, H, W) bool, nearest; as uint8, a quarter of float's bytes."""
    if tuple(masks.shape[-2:]) == tuple(size):
        return masks
    if not len(masks):
        return masks.new_zeros((0, *size))
    return F.interpolate(masks[None].to(torch.uint8), size=size, mode="nearest")[0].bool()
