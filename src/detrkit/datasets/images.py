"""Turn user images (paths, PIL images, arrays, tensors) into one normalised model batch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ImageInput = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def read_image(path: str | os.PathLike) -> Image.Image:
    """Decode an image file as RGB; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"cannot decode image {path}: {error}") from error


def to_tensor(image: ImageInput, channels: int = 3) -> torch.Tensor:
    """(C, H, W) tensor: float in [0, 1] for float input, uint8 for PIL / uint8 arrays."""
    if isinstance(image, (str, os.PathLike)):
        image = read_image(image)
    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB") if channels == 3 else image)
    if isinstance(image, np.ndarray):
        if image.ndim == 2:
            image = image[:, :, None]
        if image.ndim != 3 or image.dtype != np.uint8:
            raise ValueError(f"arrays must be HWC uint8 images, got shape {image.shape} dtype {image.dtype}")
        if not image.flags.writeable:  # e.g. np.asarray(PIL image); torch wants writable memory
            image = image.copy()
        tensor = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    elif isinstance(image, torch.Tensor):
        tensor = image
        if tensor.dtype != torch.uint8 and tensor.numel() and (tensor.min() < 0 or tensor.max() > 1):
            raise ValueError("float image tensors must hold values in [0, 1]")
    else:
        raise TypeError(f"unsupported image type {type(image).__name__}; "
                        "pass a path, PIL image, HWC uint8 array or CHW tensor")
    if tensor.dim() != 3 or tensor.shape[0] != channels:
        raise ValueError(f"expected a CHW image with {channels} channels, got shape {tuple(tensor.shape)}")
    return tensor


def to_source_image(tensor: torch.Tensor) -> np.ndarray:
    """A CHW image from `to_tensor` as an HWC uint8 array of its own (floats scaled by 255, rounded)."""
    if tensor.dtype != torch.uint8:
        tensor = tensor.detach().float().mul(255).round_().clamp_(0, 255).to(torch.uint8)
    return tensor.permute(1, 2, 0).cpu().numpy().copy()  # C order, never a view of the caller's array


class BatchPreparer:
    """Resizes images to one size (bilinear, no antialias) and normalises; constants cached."""

    def __init__(self, size: tuple[int, int], channels: int, device: torch.device) -> None:
        self.size = size
        cycle = range(channels)
        self.mean = torch.tensor([IMAGENET_MEAN[i % 3] for i in cycle], device=device).view(-1, 1, 1)
        self.scale = 1.0 / torch.tensor([IMAGENET_STD[i % 3] for i in cycle], device=device).view(-1, 1, 1)
        self.device = device

    def __call__(self, images: list[torch.Tensor]) -> torch.Tensor:
        """CHW tensors (uint8 or float in [0, 1]) -> (B, C, H, W) normalised float32 batch."""
        batch = torch.empty(len(images), self.mean.shape[0], *self.size, device=self.device)
        for out, image in zip(batch, images):
            image = image.to(self.device, non_blocking=True)
            pixels = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
            if tuple(pixels.shape[-2:]) != self.size:
                pixels = F.interpolate(pixels[None], size=self.size, mode="bilinear", align_corners=False)[0]
            torch.sub(pixels, self.mean, out=out).mul_(self.scale)
        return batch
