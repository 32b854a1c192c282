"""An aug_config run by Albumentations on one sample at a time, in the data loader workers."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from detrkit.datasets import keypoints as kp
from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.datasets.keypoint_schema import KeypointFlip

try:
    import albumentations as A
except ImportError as error:  # the registry turns this into advice
    raise ImportError("augmentation_backend 'albumentations' needs the albumentations package: "
                      "pip install 'detrkit[augment]'") from error

# containers and base classes are not transforms one can name in an aug_config
_NOT_TRANSFORMS = {"BasicTransform", "DualTransform", "ImageOnlyTransform", "Transform3D", "NoOp"}
# transforms that can mirror an image (and so need a keypoint flip map): flips, transposes, dihedral
MIRRORING = frozenset({"HorizontalFlip", "VerticalFlip", "Transpose", "D4", "SquareSymmetry", "TimeReverse"})


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
    """One Albumentations Compose for the aug_config, boxes as pixel xyxy and keypoints as pixel
    x, y that follow the image; boxes are clipped to the image and those left without area
    dropped, keypoints all kept (the caller marks those outside). Unknown names and bad keywords
    raise ValueError naming the transform."""
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
        return A.Compose(transforms, bbox_params=boxes, seed=0,
                         keypoint_params=A.KeypointParams(format="xy", remove_invisible=False))


class AlbumentationsTransform:
    """A SampleTransform: `resize` (torchvision), then the aug_config on the uint8 HWC image with
    its boxes (and instance masks, as Albumentations `masks`; keypoints, as `keypoints`), then to
    float and normalised. Albumentations keeps its own generators, so each sample reseeds them
    from the torch global generator, which the loader seeds per sample.

    Albumentations moves keypoints but never relabels them, so three probe points at the image's
    corners ride along: when they come out in the opposite turning order, the image was mirrored
    (by whichever transform) and the keypoint slots are swapped by `keypoint_flip`."""

    def __init__(self, resize: v2.Transform, aug_config: dict[str, dict],
                 keypoint_flip: KeypointFlip | None = None) -> None:
        self.resize = resize
        self.compose = build_compose(aug_config)
        self.keypoint_flip = keypoint_flip or KeypointFlip(None)
        self.mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
        self.std = torch.tensor(IMAGENET_STD)[:, None, None]

    def __call__(self, image: tv_tensors.Image, sample: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        image, sample = self.resize(image, sample)
        inputs = _inputs(image, sample)
        self.compose.set_random_seed(int(torch.randint(0, 2**31, ())))
        out = self.compose(**inputs)
        keep = torch.as_tensor(np.asarray(out["indices"], dtype=np.int64))
        pixels = torch.from_numpy(out["image"]).permute(2, 0, 1).contiguous()  # (C, H, W)
        height, width = pixels.shape[-2:]
        kept = torch.as_tensor(np.asarray(out["bboxes"], dtype=np.float32)).reshape(-1, 4)
        result = {"boxes": tv_tensors.BoundingBoxes(kept, format="XYXY", canvas_size=(height, width)),
                  "labels": sample["labels"][keep], "area": sample["area"][keep]}
        masks = sample.get("masks")
        if masks is not None:  # masks of boxes the transforms dropped go with them
            moved = torch.from_numpy(np.asarray(out["masks"])).bool() if "masks" in inputs else \
                torch.zeros((len(masks), height, width), dtype=torch.bool)
            result["masks"] = tv_tensors.Mask(moved[keep])
        if kp.KEYPOINTS in sample:
            result.update(self._keypoints(out["keypoints"], sample[kp.VISIBILITY], keep, (height, width)))
        return self._normalise(pixels), result

    def _keypoints(self, moved: np.ndarray, visibility: torch.Tensor, keep: torch.Tensor,
                   size: tuple[int, int]) -> dict[str, Any]:
        """The kept rows' moved keypoints, slots swapped when the probes say the image was mirrored."""
        count, slots = visibility.shape
        moved = torch.as_tensor(np.asarray(moved, dtype=np.float32)).reshape(-1, 2)
        points, probes = moved[:-3].reshape(count, slots, 2)[keep], moved[-3:]
        visibility = visibility.as_subclass(torch.Tensor)[keep]
        first, second = probes[1] - probes[0], probes[2] - probes[0]
        if first[0] * second[1] - first[1] * second[0] < 0:  # turning order reversed: a mirror image
            index = self.keypoint_flip.index(slots)
            points, visibility = points[:, index], visibility[:, index]
        return {kp.KEYPOINTS: tv_tensors.KeyPoints(points, canvas_size=size),
                kp.VISIBILITY: visibility.as_subclass(kp.Visibility)}

    def _normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 (or [0, 1] float, which some transforms return) -> ImageNet-normalised float, in
        place on a contiguous copy: several times faster than scaling and normalising apart."""
        scale = 255.0 if pixels.dtype == torch.uint8 else 1.0
        return pixels.float().sub_(self.mean * scale).mul_(1 / (self.std * scale))


def _inputs(image: tv_tensors.Image, sample: dict[str, Any]) -> dict[str, Any]:
    """Albumentations' keyword inputs: HWC image, boxes with their row indices, masks, and the
    keypoints flattened (N * K, 2) followed by the three probes (0, 0), (W, 0), (0, H)."""
    boxes, masks = sample["boxes"], sample.get("masks")
    inputs = {"image": np.ascontiguousarray(image.permute(1, 2, 0).numpy()),
              "bboxes": boxes.as_subclass(torch.Tensor).numpy(), "indices": np.arange(len(boxes))}
    if masks is not None and len(masks):  # Albumentations cannot stack an empty list of masks
        inputs["masks"] = masks.as_subclass(torch.Tensor).to(torch.uint8).numpy()  # (N, H, W)
    if kp.KEYPOINTS in sample:
        height, width = image.shape[-2:]
        probes = np.array([[0, 0], [width, 0], [0, height]], dtype=np.float32)
        points = sample[kp.KEYPOINTS].as_subclass(torch.Tensor).reshape(-1, 2).numpy()
        inputs["keypoints"] = np.concatenate([points, probes])
    return inputs
