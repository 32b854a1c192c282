"""An aug_config run by Albumentations on one sample at a time, in the data loader workers."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD

try:
    import albumentations as A
except ImportError as error:  # the registry turns this into advice
    raise ImportError("augmentation_backend 'albumentations' needs the albumentations package: "
                      "pip install 'detrkit[augment]'") from error

# containers and base classes are not transforms one can name in an aug_config
_NOT_TRANSFORMS = {"BasicTransform", "DualTransform", "ImageOnlyTransform", "Transform3D", "NoOp"}


def supported_transforms() -> list[str]:
    """Albumentations transforms that take an image and either leave boxes alone or move them."""
    names = []
    for name, cls in vars(A).items():
        if not inspect.isclass(cls) or name in _NOT_TRANSFORMS or inspect.isabstract(cls):
            continue
        if issubclass(cls, A.ImageOnlyTransform):
            names.append(name)
        elif issubclass(cls, A.DualTransform) and "BBOXES" in {t.name for t in getattr(cls, "_targets", ())}:
            names.append(name)
    return sorted(names)


def build_compose(aug_config: dict[str, dict]) -> A.Compose:
    """One Albumentations Compose for the aug_config, boxes as pixel xyxy that follow the image;
    boxes are clipped to the image and those left without area dropped. Unknown names and bad
    keywords raise ValueError naming the transform."""
    supported = supported_transforms()
    transforms = []
    for name, kwargs in aug_config.items():
        if name not in supported:
            raise ValueError(f"aug_config names {name!r}, which is not an Albumentations transform that "
                             f"works with boxes; supported names: {', '.join(supported)}")
        if not isinstance(kwargs, dict):
            raise ValueError(f"aug_config[{name!r}] must be a dict of keyword arguments, got {kwargs!r}")
        try:
            transforms.append(getattr(A, name)(**kwargs))
        except (TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"aug_config[{name!r}] = {kwargs}: {error}") from error
    boxes = A.BboxParams(format="pascal_voc", label_fields=["indices"], clip=True, min_area=0.0,
                         filter_invalid_bboxes=True)  # a crop before may have left boxes without area
    with warnings.catch_warnings():  # colour-only configs: boxes pass through untouched, as meant
        warnings.filterwarnings("ignore", message="Got processor for bboxes, but no transform to process it")
        return A.Compose(transforms, bbox_params=boxes, seed=0)


class AlbumentationsTransform:
    """A SampleTransform: `resize` (torchvision), then the aug_config on the uint8 HWC image with
    its boxes (and instance masks, as Albumentations `masks`), then to float and normalised. Albumentations keeps its own generators, so each
    sample reseeds them from the torch global generator, which the loader seeds per sample."""

    def __init__(self, resize: v2.Transform, aug_config: dict[str, dict]) -> None:
        self.resize = resize
        self.compose = build_compose(aug_config)
        self.mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
        self.std = torch.tensor(IMAGENET_STD)[:, None, None]

    def __call__(self, image: tv_tensors.Image, sample: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        image, sample = self.resize(image, sample)
        boxes, masks = sample["boxes"], sample.get("masks")
        inputs = {"image": np.ascontiguousarray(image.permute(1, 2, 0).numpy()),
                  "bboxes": boxes.as_subclass(torch.Tensor).numpy(), "indices": np.arange(len(boxes))}
        if masks is not None and len(masks):  # Albumentations cannot stack an empty list of masks
            inputs["masks"] = masks.as_subclass(torch.Tensor).to(torch.uint8).numpy()  # (N, H, W)
        self.compose.set_random_seed(int(torch.randint(0, 2**31, ())))
        out = self.compose(**inputs)
        keep = torch.as_tensor(np.asarray(out["indices"], dtype=np.int64))
        pixels = torch.from_numpy(out["image"]).permute(2, 0, 1).contiguous()  # (C, H, W)
        height, width = pixels.shape[-2:]
        kept = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32)).reshape(-1, 4)
        result = {"boxes": tv_tensors.BoundingBoxes(kept, format="XYXY", canvas_size=(height, width)),
                  "labels": sample["labels"][keep], "area": sample["area"][keep]}
        if masks is not None:  # masks of boxes the transforms dropped go with them
            moved = torch.from_numpy(np.asarray(out["masks"])).bool() if "masks" in inputs else \
                torch.zeros((len(masks), height, width), dtype=torch.bool)
            result["masks"] = tv_tensors.Mask(moved[keep])
        return self._normalise(pixels), result

    def _normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 (or [0, 1] float, which some transforms return) -> ImageNet-normalised float, in
        place on a contiguous copy: several times faster than scaling and normalising apart."""
        scale = 255.0 if pixels.dtype == torch.uint8 else 1.0
        return pixels.float().sub_(self.mean * scale).mul_(1 / (self.std * scale))
