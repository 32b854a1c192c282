"""An aug_config run on whole training batches on their device, with Kornia's warp and colour ops."""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

try:
    from kornia.geometry.transform import warp_affine

    from detrkit.datasets import kornia_ops
except ImportError as error:  # the registry turns this into advice
    raise ImportError("augmentation_backend 'kornia' needs the kornia package: "
                      "pip install 'detrkit[augment]'") from error

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Batch, Target

OPS = {**kornia_ops.GEOMETRIC, **kornia_ops.COLOUR}


def supported_transforms() -> list[str]:
    return sorted(OPS)


def build_ops(aug_config: dict[str, dict]) -> tuple[list, list]:
    """(geometric ops, colour ops) for the aug_config; a name or keyword this backend cannot
    express raises ValueError naming it and listing what it supports."""
    geometric, colour = [], []
    for name, kwargs in aug_config.items():
        if name not in OPS:
            raise ValueError(f"aug_config names {name!r}, which the kornia augmentation backend cannot "
                             f"express; it supports: {', '.join(supported_transforms())} (use "
                             f"augmentation_backend='albumentations' for the others)")
        if not isinstance(kwargs, dict):
            raise ValueError(f"aug_config[{name!r}] must be a dict of keyword arguments, got {kwargs!r}")
        op = OPS[name]
        accepted = [k for k in inspect.signature(op).parameters]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise ValueError(f"aug_config[{name!r}]: the kornia backend does not support {unknown}; "
                             f"{name} accepts {', '.join(accepted)}")
        try:
            built = op(**kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError(f"aug_config[{name!r}] = {kwargs}: {error}") from error
        (geometric if name in kornia_ops.GEOMETRIC else colour).append(built)
    return geometric, colour


class KorniaAugment:
    """Batch -> Batch on the batch's device: uint8 or [0, 1] pixels in, normalised pixels out.

    All geometric ops compose into one matrix per image, applied by one warp of the whole batch
    and to the boxes' corners; the colour ops follow in their config order. Each image moves
    about its own centre, so padded batches work: the padding stays where it is and is zeroed.
    Randomness: one number from the torch global generator per batch seeds the draws.
    """

    def __init__(self, aug_config: dict[str, dict]) -> None:
        self.geometric, self.colour = build_ops(aug_config)
        self.mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
        self.std = torch.tensor(IMAGENET_STD)[:, None, None]

    def __call__(self, batch: Batch) -> Batch:
        pixels = batch.pixels
        images = pixels.to(torch.float32, copy=True)  # (B, C, H, W), our own to change in place
        if pixels.dtype == torch.uint8:
            images.div_(255)
        draws = kornia_ops.Draws(int(torch.randint(0, 2**62, ())), images.device)
        valid = None if batch.padding is None else (~batch.padding)[:, None].to(images.dtype)  # (B, 1, H, W)
        targets = batch.targets
        if self.geometric:
            sizes = torch.tensor([[t.size[1], t.size[0]] for t in targets], dtype=torch.float32)  # (B, 2) w, h
            matrix = torch.eye(3).repeat(len(targets), 1, 1)
            for op in self.geometric:
                matrix = op.matrices(sizes, draws) @ matrix
            moved = (matrix - torch.eye(3)).abs().amax(dim=(1, 2)) > 1e-6  # host: which images any op moved
            images = kornia_ops.on_chosen(images, None, moved.nonzero()[:, 0],
                                          lambda part, _: warp(part, matrix[moved].to(images.device)))
            targets = move_boxes(targets, matrix, sizes)
        for op in self.colour:
            images = op(images, valid, draws)
        images = images.sub_(self.mean.to(images.device)).div_(self.std.to(images.device))
        if batch.padding is not None:
            images = images.masked_fill_(batch.padding[:, None], 0)
        return Batch(images, batch.padding, targets)


def warp(images: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Warp (B, C, H, W) by (B, 3, 3) continuous-coordinate matrices (bilinear, zeros outside).
    Pixel centres sit at index + 0.5, so the index-space matrix is T(-0.5) @ matrix @ T(0.5)."""
    half = torch.eye(3, device=matrix.device)
    half[:2, 2] = 0.5
    back = torch.eye(3, device=matrix.device)
    back[:2, 2] = -0.5
    index_matrix = back @ matrix @ half
    return warp_affine(images, index_matrix[:, :2], dsize=tuple(images.shape[-2:]), mode="bilinear",
                       padding_mode="zeros", align_corners=True)


def move_boxes(targets: list[Target], matrix: torch.Tensor, sizes: torch.Tensor) -> list[Target]:
    """Each target's boxes through its image's matrix: the box around the moved corners, clipped
    to the image; boxes left without area are dropped with their labels and areas."""
    counts = [len(t.labels) for t in targets]
    if not sum(counts):
        return targets
    device = targets[0].boxes.device
    owner_host = torch.repeat_interleave(torch.arange(len(targets)), torch.tensor(counts))  # (N,) image of each box
    owner = owner_host.to(device, non_blocking=True)
    matrix, sizes = matrix.to(device, non_blocking=True), sizes.to(device, non_blocking=True)
    scale = sizes[owner].repeat(1, 2)  # (N, 4) w, h, w, h
    x0, y0, x1, y1 = (cxcywh_to_xyxy(torch.cat([t.boxes for t in targets])) * scale).unbind(-1)
    corners = torch.stack([torch.stack(c, -1) for c in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))], 1)  # (N, 4, 2)
    linear, shift = matrix[owner, :2, :2], matrix[owner, :2, 2]
    moved = corners @ linear.transpose(1, 2) + shift[:, None]  # (N, 4, 2)
    boxes = torch.cat([moved.amin(1), moved.amax(1)], -1)
    boxes = torch.minimum(boxes.clamp(min=0), scale)
    keep = ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).cpu()  # the one host sync: lengths
    index = keep.nonzero()[:, 0]
    kept_counts = torch.bincount(owner_host[index], minlength=len(targets)).tolist()
    index = index.to(device, non_blocking=True)
    boxes = (xyxy_to_cxcywh(boxes) / scale).index_select(0, index).split(kept_counts)
    labels = torch.cat([t.labels for t in targets]).index_select(0, index).split(kept_counts)
    areas = [None] * len(targets)
    if all(t.area is not None for t in targets):
        areas = torch.cat([t.area for t in targets]).index_select(0, index).split(kept_counts)
    return [replace(target, boxes=box, labels=label, area=area)
            for target, box, label, area in zip(targets, boxes, labels, areas)]
