"""Mosaic and mixup: training samples made from several transformed samples of the training set.

They act on transformed samples (pixels and Target), so they work the same whatever the
augmentation backend: normalised float pixels (torchvision, Albumentations) or uint8 pixels that
the Kornia backend augments later on the device, where a mosaic is then augmented as one image.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from detrkit.datasets.keypoints import mark_outside
from detrkit.datasets.transforms import resize_masks
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Target

Sample = tuple[torch.Tensor, Target]
MIXUP_BETA = 32.0  # mixup weight ~ Beta(32, 32): close to an even blend, as in YOLOv5
MIN_VISIBLE = 0.25  # a mosaic keeps a box if at least this share of it stays on the canvas


def mosaic(samples: list[Sample], centre: tuple[float, float]) -> Sample:
    """Four samples at half size around `centre` (x, y as fractions of the first sample's size):
    the first above left of it, then above right, below left, below right. Each tile is cut by
    the canvas; boxes (and masks) are cut with it, and dropped when less than MIN_VISIBLE of a box
    remains; keypoints the canvas cuts off are zeroed."""
    pixels, first = samples[0]
    height, width = pixels.shape[-2:]
    tile_h, tile_w = height // 2, width // 2
    cx, cy = round(centre[0] * width), round(centre[1] * height)
    canvas = torch.zeros_like(pixels, dtype=torch.float32)
    parts = []
    for (image, target), (right, below) in zip(samples, ((0, 0), (1, 0), (0, 1), (1, 1))):
        tile = F.interpolate(image[None].float(), size=(tile_h, tile_w), mode="bilinear", antialias=True,
                             align_corners=False)[0]
        left, top = (cx if right else cx - tile_w), (cy if below else cy - tile_h)
        x0, y0, x1, y1 = max(left, 0), max(top, 0), min(left + tile_w, width), min(top + tile_h, height)
        canvas[:, y0:y1, x0:x1] = tile[:, y0 - top:y1 - top, x0 - left:x1 - left]
        parts.append(_placed(target, (left, top, tile_w, tile_h), (x0, y0, x1, y1), (height, width)))
    boxes, labels, areas, masks, points = (list(part) for part in zip(*parts))
    size = torch.tensor([width, height, width, height], dtype=torch.float32)
    mixed = _mixed_target(first, xyxy_to_cxcywh(torch.cat(boxes)) / size, torch.cat(labels), torch.cat(areas),
                          _cat_masks(masks), _cat_masks(points))
    return _like(canvas, pixels), mixed


def _placed(target: Target, tile: tuple[int, int, int, int], window: tuple[int, int, int, int],
            canvas: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    """(boxes xyxy on the canvas, labels, areas, masks (n, H, W) or None, keypoints (n, K, 3)
    normalised to the canvas or None) of one tile placed with its top-left corner at (left, top),
    cut to the window (x0, y0, x1, y1) of it that the canvas shows."""
    left, top, tile_w, tile_h = tile
    x0, y0, x1, y1 = window
    placed = cxcywh_to_xyxy(target.boxes) * torch.tensor([tile_w, tile_h, tile_w, tile_h]) \
        + torch.tensor([left, top, left, top])
    cut = torch.minimum(torch.maximum(placed, torch.tensor([x0, y0, x0, y0])), torch.tensor([x1, y1, x1, y1]))
    keep = _area(cut) >= MIN_VISIBLE * _area(placed).clamp(min=1e-6)
    keep &= (cut[:, 2] > cut[:, 0]) & (cut[:, 3] > cut[:, 1])
    masks = None
    if target.masks is not None:
        tiled = resize_masks(target.masks[keep], (tile_h, tile_w))
        masks = tiled.new_zeros((len(tiled), *canvas))
        masks[:, y0:y1, x0:x1] = tiled[:, y0 - top:y1 - top, x0 - left:x1 - left]
    points = None if target.keypoints is None else _placed_keypoints(target.keypoints[keep], tile, window, canvas)
    return cut[keep], target.labels[keep], _areas(target)[keep], masks, points


def _placed_keypoints(keypoints: torch.Tensor, tile: tuple[int, int, int, int], window: tuple[int, int, int, int],
                      canvas: tuple[int, int]) -> torch.Tensor:
    """(n, K, 3) keypoints of a tile, normalised to the canvas; those outside the window zeroed."""
    left, top, tile_w, tile_h = tile
    x0, y0, x1, y1 = window
    pixels = keypoints[..., :2] * torch.tensor([tile_w, tile_h]) + torch.tensor([left - x0, top - y0])
    pixels, visibility = mark_outside(pixels, keypoints[..., 2], (y1 - y0, x1 - x0))
    pixels = (pixels + torch.tensor([x0, y0])) * (visibility[..., None] > 0)
    return torch.cat([pixels / torch.tensor([canvas[1], canvas[0]]), visibility[..., None]], -1)


def mixup(a: Sample, b: Sample, weight: float) -> Sample:
    """weight * a + (1 - weight) * b (b resized to a's size), with the boxes (masks, keypoints) of both."""
    pixels, target = a
    other, other_target = b
    if other.shape[-2:] != pixels.shape[-2:]:
        other = F.interpolate(other[None].float(), size=tuple(pixels.shape[-2:]), mode="bilinear",
                              antialias=True, align_corners=False)[0]
    blend = weight * pixels.float() + (1 - weight) * other.float()
    masks = [target.masks, None if other_target.masks is None else resize_masks(other_target.masks, target.size)]
    mixed = _mixed_target(target, torch.cat([target.boxes, other_target.boxes]),
                          torch.cat([target.labels, other_target.labels]),
                          torch.cat([_areas(target), _areas(other_target)]), _cat_masks(masks),
                          _cat_masks([target.keypoints, other_target.keypoints]))
    return _like(blend, pixels), mixed


def _cat_masks(masks: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The masks (or keypoints) of all parts, or None when the samples carry none."""
    return None if any(m is None for m in masks) else torch.cat(masks)


def _area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)


def _areas(target: Target) -> torch.Tensor:
    return target.area if target.area is not None else torch.zeros(len(target.labels))


def _mixed_target(first: Target, boxes: torch.Tensor, labels: torch.Tensor, area: torch.Tensor,
                  masks: torch.Tensor | None, keypoints: torch.Tensor | None) -> Target:
    """The first sample's identity with the combined boxes; crowd regions no longer apply."""
    return replace(first, boxes=boxes.to(first.boxes.dtype), labels=labels, area=area, masks=masks, keypoints=keypoints,
                   crowd_boxes=torch.zeros((0, 4)), crowd_labels=torch.zeros(0, dtype=torch.int64))


def _like(values: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    if reference.dtype == torch.uint8:
        return values.round().clamp(0, 255).to(torch.uint8)
    return values.to(reference.dtype)


class MixedSamples(Dataset):
    """Wraps a data set read by (index, seed) keys (SeededSamples) and reads (index, seed, epoch):
    before `until_epoch`, a sample becomes a mosaic with probability `mosaic_p`, and is then
    blended with another with probability `mixup_p`. The partners and every draw follow from the
    key's seed alone, so runs stay reproducible and resumable."""

    def __init__(self, dataset: Dataset, mosaic_p: float, mixup_p: float, until_epoch: int) -> None:
        self.dataset = dataset
        self.mosaic_p, self.mixup_p, self.until_epoch = mosaic_p, mixup_p, until_epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, int]) -> Sample:
        index, seed, epoch = key
        sample = self.dataset[(index, seed)]
        if epoch >= self.until_epoch:
            return sample
        rng = np.random.default_rng([seed, 0x6D6978])  # a stream apart from the sample's transforms
        if self.mosaic_p and rng.random() < self.mosaic_p:
            others = [self._partner(rng) for _ in range(3)]
            sample = mosaic([sample, *others], tuple(rng.uniform(0.25, 0.75, 2)))
        if self.mixup_p and rng.random() < self.mixup_p:
            sample = mixup(sample, self._partner(rng), float(rng.beta(MIXUP_BETA, MIXUP_BETA)))
        return sample

    def _partner(self, rng: np.random.Generator) -> Sample:
        return self.dataset[(int(rng.integers(len(self.dataset))), int(rng.integers(2**62)))]

    def __getattr__(self, name: str):  # class_names, coco_ground_truth() and such
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
