"""Batch (pixels, Target) samples, padding images to a common size that divides by the block."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from detrkit.structures import Batch, Target


def collate(samples: Sequence[tuple[torch.Tensor, Target]], block: int) -> Batch:
    """Pad every image (bottom and right, zeros) to the batch's max H and W rounded up to a
    multiple of `block`; padding is True on padded pixels, None when no image needed any.
    Use `functools.partial(collate, block=...)` as a DataLoader collate_fn."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    images = [image for image, _ in samples]
    height = -(-max(image.shape[-2] for image in images) // block) * block
    width = -(-max(image.shape[-1] for image in images) // block) * block
    pixels = images[0].new_zeros((len(images), images[0].shape[0], height, width))  # (B, C, H, W)
    padding = torch.ones((len(images), height, width), dtype=torch.bool)
    for index, image in enumerate(images):
        h, w = image.shape[-2:]
        pixels[index, :, :h, :w] = image
        padding[index, :h, :w] = False
    padded = any(tuple(image.shape[-2:]) != (height, width) for image in images)
    return Batch(pixels, padding if padded else None, [target for _, target in samples])
