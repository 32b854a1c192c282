"""Keypoints inside a transformed sample: their pixel form, the mirror that relabels them, and the visibility rule.

A sample carries keypoints as torchvision KeyPoints (N, K, 2) pixel x, y, which its resizes,
crops and flips move as they move boxes, and their visibility as a Visibility (N, K) that they
pass through. Keypoint coordinates follow the pixel-index convention (pixel i is centred on i),
so a mirror sends x to W - 1 - x, as torchvision and Albumentations do (spec 12.8). A keypoint
that is unlabelled (v = 0) or leaves the image [0, W) x [0, H) becomes (0, 0, 0).
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from detrkit.datasets.keypoint_schema import KeypointFlip

KEYPOINTS, VISIBILITY = "keypoints", "keypoint_visibility"  # the sample keys


class Visibility(tv_tensors.TVTensor):
    """(N, K) keypoint visibility 0, 1 or 2, riding along a sample: torchvision transforms pass a
    tv_tensor type they do not know through unchanged, and MirrorFlip permutes it."""


def to_sample(keypoints: torch.Tensor, size: tuple[int, int]) -> dict[str, Any]:
    """{KEYPOINTS: KeyPoints in pixels, VISIBILITY: Visibility} from (N, K, 3) normalised keypoints."""
    height, width = size
    pixels = keypoints[..., :2] * torch.tensor([width, height], dtype=keypoints.dtype)
    pixels, visibility = mark_outside(pixels, keypoints[..., 2], size)
    return {KEYPOINTS: tv_tensors.KeyPoints(pixels, canvas_size=size),
            VISIBILITY: visibility.as_subclass(Visibility)}


def mark_outside(pixels: torch.Tensor, visibility: torch.Tensor,
                 size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels (..., K, 2), visibility (..., K)) with unlabelled and out-of-image keypoints zeroed."""
    height, width = size
    x, y = pixels[..., 0], pixels[..., 1]
    keep = (visibility > 0) & (x >= 0) & (x < width) & (y >= 0) & (y < height)
    plain = pixels.as_subclass(torch.Tensor), visibility.as_subclass(torch.Tensor)
    return plain[0] * keep[..., None], plain[1] * keep


def to_target(sample: dict[str, Any], keep: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(N, K, 3) x / W, y / H, v of the kept rows of a transformed sample, marked as above."""
    height, width = size
    pixels, visibility = mark_outside(sample[KEYPOINTS], sample[VISIBILITY], size)
    scale = torch.tensor([width, height], dtype=pixels.dtype)
    return torch.cat([pixels / scale, visibility[..., None].to(pixels.dtype)], -1)[keep]


def mark_sample(image: Any, sample: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A pipeline step (for v2.Compose) zeroing the keypoints a crop has put outside the image, so
    that a later flip cannot bring them back in (a point just left of 0 lands just left of W)."""
    if KEYPOINTS in sample:
        points = sample[KEYPOINTS]
        pixels, visibility = mark_outside(points, sample[VISIBILITY], points.canvas_size)
        sample = {**sample, KEYPOINTS: tv_tensors.wrap(pixels, like=points),
                  VISIBILITY: visibility.as_subclass(Visibility)}
    return image, sample


class MirrorFlip(v2.RandomHorizontalFlip):
    """RandomHorizontalFlip that also swaps keypoint slots by the flip map; data sets without
    keypoints flip as usual. A keypoint sample without a flip map is an error when flipped."""

    def __init__(self, p: float = 0.5, flip: KeypointFlip | None = None) -> None:
        super().__init__(p)
        self.flip = flip or KeypointFlip(None)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        out = super().transform(inpt, params)
        if isinstance(inpt, tv_tensors.KeyPoints):
            return tv_tensors.wrap(out[..., self.flip.index(out.shape[-2]), :], like=out)
        if isinstance(inpt, Visibility):
            return out[..., self.flip.index(out.shape[-1])].as_subclass(Visibility)
        return out
