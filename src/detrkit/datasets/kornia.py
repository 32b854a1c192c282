"""An aug_config run on whole training batches on their device: one warp for the geometry, then colour ops."""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch
import torch.nn.functional as F

try:
    import kornia  # noqa: F401  (the ops below use it)

    from detrkit.datasets import kornia_ops
except ImportError as error:  # the registry turns this into advice
    raise ImportError("augmentation_backend 'kornia' needs the kornia package: "
                      "pip install 'detrkit[augment]'") from error

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.datasets.keypoint_schema import KeypointFlip
from detrkit.datasets.keypoints import mark_outside
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Batch, Target

OPS = {**kornia_ops.GEOMETRIC, **kornia_ops.COLOUR}
MIRRORING = frozenset({"HorizontalFlip", "VerticalFlip"})  # the ops that can mirror an image


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

    All geometric ops compose into one matrix per image, applied by one warp of the whole batch,
    to the boxes' corners, to the instance masks (nearest) and to the keypoints, whose slots
    `keypoint_flip` swaps in images whose matrix mirrors; the colour ops follow in their config
    order. Each image moves about its own centre, so padded batches work: the padding stays where
    it is and is zeroed. Randomness: one number from the torch global generator per batch seeds the draws.
    """

    def __init__(self, aug_config: dict[str, dict], keypoint_flip: KeypointFlip | None = None) -> None:
        self.geometric, self.colour = build_ops(aug_config)
        self.keypoint_flip = keypoint_flip or KeypointFlip(None)
        self.mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
        self.std = torch.tensor(IMAGENET_STD)[:, None, None]

    def __call__(self, batch: Batch) -> Batch:
        pixels = batch.pixels
        images = pixels.to(torch.float32, copy=True)  # (B, C, H, W), our own to change in place
        scale = 255.0 if pixels.dtype == torch.uint8 else 1.0  # warps and flips work at any scale
        draws = kornia_ops.Draws(int(torch.randint(0, 2**62, ())), images.device)
        valid = None if batch.padding is None else (~batch.padding)[:, None].to(images.dtype)  # (B, 1, H, W)
        targets = batch.targets
        if self.geometric:
            sizes = torch.tensor([[t.size[1], t.size[0]] for t in targets], dtype=torch.float32)  # (B, 2) w, h
            matrix = torch.eye(3).repeat(len(targets), 1, 1)
            for op in self.geometric:
                matrix = op.matrices(sizes, draws) @ matrix
            images = apply_geometry(images, matrix, sizes)
            targets = move_keypoints(move_masks(targets, matrix), matrix, self.keypoint_flip)
            targets = move_boxes(targets, matrix, sizes)
        if self.colour:
            images, scale = images.div_(scale), 1.0  # colour ops work in [0, 1]
        for op in self.colour:
            images = op(images, valid, draws)
        images = images.sub_(self.mean.to(images.device) * scale).mul_(1 / (self.std.to(images.device) * scale))
        if batch.padding is not None:
            images = images.masked_fill_(batch.padding[:, None], 0)
        return Batch(images, batch.padding, targets)


def apply_geometry(images: torch.Tensor, matrix: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Each image through its (host) matrix: flips and quarter turns of images that fill the canvas
    by exact reindexing, anything else by one bilinear warp per group; unmoved images stay."""
    canvas = (images.shape[-1], images.shape[-2])
    groups: dict[tuple[bool, bool, bool] | None, list[int]] = {}
    for index in range(len(matrix)):
        groups.setdefault(pixel_permutation(matrix[index], sizes[index], canvas), []).append(index)
    for key, members in groups.items():
        chosen = torch.tensor(members)
        if key is None:
            images = kornia_ops.on_chosen(images, None, chosen,
                                          lambda part, _: warp(part, matrix[chosen].to(images.device)))
        elif any(key):
            images = kornia_ops.on_chosen(images, None, chosen, lambda part, _, key=key: permute_pixels(part, *key))
    return images


def pixel_permutation(matrix: torch.Tensor, size: torch.Tensor,
                      canvas: tuple[int, int]) -> tuple[bool, bool, bool] | None:
    """(transpose, flip x, flip y) when the (3, 3) matrix maps an image that fills the canvas onto
    itself pixel for pixel (flips, and quarter turns of squares), else None."""
    width, height = size.tolist()
    linear, shift = matrix[:2, :2], matrix[:2, 2]
    rounded = linear.round()
    if (width, height) != canvas or (linear - rounded).abs().max() > 1e-6 or abs(torch.det(rounded)) != 1:
        return None
    transpose = bool(rounded[0, 0] == 0)
    centre = size / 2
    if (transpose and width != height) or (shift - (centre - rounded @ centre)).abs().max() > 1e-4:
        return None
    if transpose:
        return True, bool(rounded[0, 1] < 0), bool(rounded[1, 0] < 0)
    return False, bool(rounded[0, 0] < 0), bool(rounded[1, 1] < 0)


def permute_pixels(images: torch.Tensor, transpose: bool, flip_x: bool, flip_y: bool) -> torch.Tensor:
    """(B, C, H, W) swapped about the diagonal first, then flipped; the twin of `warp` for
    the matrices `pixel_permutation` recognises."""
    if transpose:
        images = images.transpose(-1, -2)
    dims = [dim for dim, flip in ((-1, flip_x), (-2, flip_y)) if flip]
    return images.flip(dims) if dims else images


def warp(images: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Warp (B, C, H, W) by (B, 3, 3) continuous-coordinate matrices: each output pixel centre
    (x + 0.5, y + 0.5) reads the input, bilinearly, where the inverse matrix sends it; zeros
    outside. Kornia's warp_affine (the twin in the tests) builds the same grid through
    normalised homographies at several times the cost on CPU; grid_sample does the sampling."""
    count, _, height, width = images.shape
    inverse = torch.linalg.inv(matrix.double()).float()[:, :2]  # (B, 2, 3) output -> input
    # grid_sample (align_corners=False) reads continuous coordinates u as 2 u / size - 1
    inverse = inverse * torch.tensor([[2 / width], [2 / height]], device=matrix.device)
    inverse[:, :, 2] -= 1
    xs = torch.arange(width, device=images.device, dtype=torch.float32).add_(0.5)
    ys = torch.arange(height, device=images.device, dtype=torch.float32).add_(0.5)[:, None]
    coefficients = inverse.to(images.device)[:, :, :, None, None]  # (B, 2, 3, 1, 1)
    grid = coefficients[:, :, 0] * xs + coefficients[:, :, 1] * ys + coefficients[:, :, 2]  # (B, 2, H, W)
    return F.grid_sample(images, grid.permute(0, 2, 3, 1), mode="bilinear", padding_mode="zeros",
                         align_corners=False)


def move_masks(targets: list[Target], matrix: torch.Tensor) -> list[Target]:
    """Each target's instance masks (N, h, w) through its image's (host) matrix, nearest: one
    gather per moved image serves all of its masks; unmoved images and targets without masks stay."""
    moved = []
    for target, transform in zip(targets, matrix):
        if target.masks is not None and len(target.masks) and not torch.equal(transform, torch.eye(3)):
            target = replace(target, masks=warp_masks(target.masks, transform))
        moved.append(target)
    return moved


def warp_masks(masks: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """(N, h, w) bool masks through a (3, 3) continuous-coordinate matrix: each output pixel takes
    the input pixel its centre's inverse image falls in, false outside; the nearest-neighbour twin
    of `warp`, by index (no float copy of the masks)."""
    count, height, width = masks.shape
    inverse = torch.linalg.inv(matrix.double()).float().to(masks.device)  # output -> input
    xs = torch.arange(width, device=masks.device, dtype=torch.float32).add_(0.5)
    ys = torch.arange(height, device=masks.device, dtype=torch.float32).add_(0.5)[:, None]
    columns = (inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]).floor_()  # (h, w)
    rows = (inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]).floor_()
    inside = (columns >= 0) & (columns < width) & (rows >= 0) & (rows < height)
    index = (rows.clamp_(0, height - 1) * width + columns.clamp_(0, width - 1)).long().flatten()
    return masks.flatten(1).index_select(1, index).view(count, height, width) & inside


def move_keypoints(targets: list[Target], matrix: torch.Tensor, flip: KeypointFlip) -> list[Target]:
    """Each target's keypoints through its image's (host) matrix, slots swapped by `flip` where the
    matrix mirrors; those left outside the image zeroed. Keypoints are pixel-index coordinates
    (pixel i centred on i), so they move as i + 0.5 in the matrices' continuous frame."""
    moved = []
    for target, transform in zip(targets, matrix):
        points = target.keypoints
        if points is None or not len(points) or torch.equal(transform, torch.eye(3)):
            moved.append(target)
            continue
        height, width = target.size
        scale = torch.tensor([width, height], dtype=points.dtype, device=points.device)
        linear, shift = transform[:2, :2].to(points.device), transform[:2, 2].to(points.device)
        pixels = (points[..., :2] * scale + 0.5) @ linear.T + shift - 0.5  # (N, K, 2)
        visibility = points[..., 2]
        if torch.det(transform[:2, :2]) < 0:  # a mirror image: left and right trade slots
            index = flip.index(points.shape[1]).to(points.device)
            pixels, visibility = pixels[:, index], visibility[:, index]
        pixels, visibility = mark_outside(pixels, visibility, target.size)
        moved.append(replace(target, keypoints=torch.cat([pixels / scale, visibility[..., None]], -1)))
    return moved


def move_boxes(targets: list[Target], matrix: torch.Tensor, sizes: torch.Tensor) -> list[Target]:
    """Each target's boxes through its image's matrix: the box around the moved corners, clipped
    to the image; boxes left without area are dropped with their labels, areas, masks and keypoints."""
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
    rows = _local_rows(keep, counts)
    masks = [_select(t.masks, kept) for t, kept in zip(targets, rows)]
    points = [_select(t.keypoints, kept) for t, kept in zip(targets, rows)]
    return [replace(target, boxes=box, labels=label, area=area, masks=mask, keypoints=point)
            for target, box, label, area, mask, point in zip(targets, boxes, labels, areas, masks, points)]


def _select(values: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if values is None else values.index_select(0, rows.to(values.device, non_blocking=True))


def _local_rows(keep: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
    """The kept rows of each target, numbered within it, from the (N,) host flags of all rows."""
    return [part.nonzero()[:, 0] for part in keep.split(counts)]
