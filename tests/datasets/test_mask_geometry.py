"""Masks follow their boxes through every transform path: the bounding box of each transformed
mask is its transformed box (within a pixel; 2 for Albumentations' own rotations), and a dropped
box takes its mask with it."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_data import write_image

from detrkit.datasets import segments
from detrkit.datasets.collate import collate
from detrkit.datasets.detection import DetectionDataset, ImageRecord
from detrkit.datasets.mixing import mixup, mosaic
from detrkit.datasets.transforms import (
    build_eval_transform,
    build_train_resize,
    build_train_transform,
    resize_batch,
)
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Batch, Target

pytest.importorskip("pycocotools")
pytest.importorskip("albumentations")
pytest.importorskip("kornia")

from detrkit.datasets.albumentations import AlbumentationsTransform  # noqa: E402
from detrkit.datasets.kornia import KorniaAugment, warp_masks  # noqa: E402

# rectangles stay rectangles under resize, crop and flip: their masks' bounds are exact
RECTANGLES = [[40, 30, 200, 150], [300, 60, 420, 300], [500, 350, 690, 490], [100, 380, 160, 470]]  # on 700 x 500
CENTRED = [[300, 200, 420, 280], [330, 150, 370, 340]]  # stay inside under the rotations below
GEOMETRY = {
    "HorizontalFlip": {"HorizontalFlip": {"p": 1.0}},
    "VerticalFlip": {"VerticalFlip": {"p": 1.0}},
    "RandomRotate90": {"RandomRotate90": {"p": 1.0}},
    "Rotate": {"Rotate": {"limit": 25, "p": 1.0}},
    "Affine": {"Affine": {"scale": (0.8, 1.2), "translate_percent": (-0.05, 0.05), "rotate": (-20, 20),
                          "shear": (-5, 5), "p": 1.0}},
}


def mask_box(mask: torch.Tensor) -> torch.Tensor:
    """xyxy of a mask's pixels in continuous coordinates (pixel x covers [x, x + 1))."""
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return torch.stack([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float()


def pixel_boxes(target: Target) -> torch.Tensor:
    height, width = target.size
    return cxcywh_to_xyxy(target.boxes) * torch.tensor([width, height, width, height])


def assert_aligned(target: Target, tolerance: float = 1.0) -> None:
    assert target.masks is not None and target.masks.dtype == torch.bool
    assert target.masks.shape == (len(target.labels), *target.size)
    for label, box, mask in zip(target.labels.tolist(), pixel_boxes(target), target.masks):
        if not mask.any():  # a crop can leave a sliver of a box that covers no pixel centre
            assert min(box[2] - box[0], box[3] - box[1]) < 1, f"box {box.tolist()} of label {label}: empty mask"
            continue
        error = (mask_box(mask) - box).abs().max().item()
        assert error <= tolerance, (label, box.tolist(), mask_box(mask).tolist())


def rectangle_dataset(tmp_path, transform, rectangles=RECTANGLES, size=(500, 700)) -> DetectionDataset:
    """One noise image with rectangle masks, labels 0..n-1 (so kept rows can be told apart)."""
    height, width = size
    image = write_image(tmp_path / "a.png", width, height)
    polygons = [np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], dtype=float) for x0, y0, x1, y1 in rectangles]
    record = ImageRecord(path=image, image_id=0, size=size, iscrowd=np.zeros(len(rectangles), dtype=bool),
                         boxes=np.array(rectangles, dtype=np.float32) / [width, height, width, height],
                         labels=np.arange(len(rectangles)),
                         mask_rles=[segments.encode_polygons([p], size, "test") for p in polygons])
    return DetectionDataset([record], ["a"] * len(rectangles), transform)


def target_of(rectangles: list[list[int]], size: tuple[int, int]) -> Target:
    height, width = size
    masks = torch.zeros(len(rectangles), height, width, dtype=torch.bool)
    for mask, (x0, y0, x1, y1) in zip(masks, rectangles):
        mask[y0:y1, x0:x1] = True
    boxes = xyxy_to_cxcywh(torch.tensor(rectangles, dtype=torch.float32).reshape(-1, 4)) / torch.tensor([width, height] * 2)
    return Target(boxes, torch.arange(len(rectangles)), 0, size, size, torch.ones(len(rectangles)), masks=masks)


def test_default_pipeline_resizes_crops_and_flips_masks_with_boxes(tmp_path):
    dataset = rectangle_dataset(tmp_path, build_train_transform([320, 384, 448], square=True, scale_jitter=True))
    dropped = 0
    for seed in range(24):
        torch.manual_seed(seed)
        _, target = dataset[0]
        assert_aligned(target)
        dropped += len(target.labels) < len(RECTANGLES)
    assert dropped, "no crop dropped a box: the test does not cover dropping"


def test_eval_transform_keeps_masks_aligned_without_square_resize(tmp_path):
    _, target = rectangle_dataset(tmp_path, build_eval_transform(250, square=False))[0]
    assert target.size == (250, 350) and len(target.labels) == len(RECTANGLES)
    assert_aligned(target)


@pytest.mark.parametrize("name", GEOMETRY)
def test_albumentations_moves_masks_with_boxes(tmp_path, name):
    """Albumentations moves both; under rotation its OpenCV mask warp and its box maths differ by
    up to ~1.6 px (measured over 40 draws), so rotations get 2 px here."""
    resize = build_train_resize([384], square=False, scale_jitter=False)
    dataset = rectangle_dataset(tmp_path, AlbumentationsTransform(resize, GEOMETRY[name]), CENTRED)
    for seed in range(6):
        torch.manual_seed(seed)
        _, target = dataset[0]
        assert len(target.labels) == len(CENTRED)
        assert_aligned(target, tolerance=2.0 if name in ("Rotate", "Affine") else 1.0)


def test_albumentations_drops_masks_with_boxes_pushed_away(tmp_path):
    config = {"Affine": {"translate_percent": (0.45, 0.45), "p": 1.0}}
    resize = build_train_resize([500], square=False, scale_jitter=False)
    _, target = rectangle_dataset(tmp_path, AlbumentationsTransform(resize, config))[0]
    assert target.labels.tolist() == [0, 1]  # 315 px right, 225 px down: the others left the image
    assert_aligned(target)


def padded_batch(samples: list[tuple[torch.Tensor, Target]]) -> Batch:
    return collate(samples, block=16)


@pytest.mark.parametrize("name", GEOMETRY)
def test_kornia_warps_masks_of_a_padded_batch_with_their_boxes(name):
    big, small = [[60, 40, 100, 80], [20, 50, 50, 70]], [[20, 16, 44, 40]]
    samples = [(torch.zeros(3, 120, 160, dtype=torch.uint8), target_of(big, (120, 160))),
               (torch.zeros(3, 60, 64, dtype=torch.uint8), target_of(small, (60, 64)))]
    for seed in range(6):
        torch.manual_seed(seed)
        out = KorniaAugment(GEOMETRY[name])(padded_batch(samples))
        for target, rectangles in zip(out.targets, (big, small)):
            assert len(target.labels) == len(rectangles)
            assert_aligned(target)


def test_kornia_drops_masks_with_boxes_pushed_away():
    config = {"Affine": {"translate_percent": (0.45, 0.45), "p": 1.0}}
    sample = (torch.zeros(3, 120, 160, dtype=torch.uint8), target_of([[10, 10, 120, 110], [120, 10, 150, 40]], (120, 160)))
    out = KorniaAugment(config)(padded_batch([sample]))
    assert out.targets[0].labels.tolist() == [0]
    assert_aligned(out.targets[0])


def test_warp_masks_matches_nearest_grid_sample():
    """The gather in warp_masks against grid_sample's nearest mode (the twin): they differ only
    where a pixel centre's inverse image lies exactly on a pixel edge."""
    torch.manual_seed(0)
    masks = torch.rand(3, 40, 56) > 0.5
    angle = torch.tensor(0.3)
    matrix = torch.tensor([[torch.cos(angle) * 1.1, -torch.sin(angle), 9.3],
                           [torch.sin(angle), torch.cos(angle) * 0.9, -4.7], [0.0, 0.0, 1.0]])
    inverse = torch.linalg.inv(matrix)[:2]
    xs, ys = torch.meshgrid(torch.arange(56) + 0.5, torch.arange(40) + 0.5, indexing="xy")
    source = torch.einsum("ij,jhw->ihw", inverse, torch.stack([xs, ys, torch.ones_like(xs)]))  # (2, h, w)
    grid = torch.stack([source[0] * 2 / 56 - 1, source[1] * 2 / 40 - 1], -1)[None].expand(3, -1, -1, -1)
    twin = F.grid_sample(masks[:, None].float(), grid, mode="nearest", align_corners=False)[:, 0] > 0.5
    assert (warp_masks(masks, matrix) != twin).float().mean() < 1e-3


def test_mosaic_places_and_cuts_masks_with_boxes():
    rectangles = [[[0, 0, 32, 32], [40, 10, 90, 50]], [[64, 0, 96, 32]], [[0, 32, 96, 64]], [[32, 16, 64, 48]]]
    samples = [(torch.zeros(3, 64, 96, dtype=torch.uint8), target_of(r, (64, 96))) for r in rectangles]
    for centre in ((0.5, 0.5), (0.25, 0.5), (0.7, 0.3)):
        _, target = mosaic(samples, centre)
        assert target.masks.shape[-2:] == (64, 96)
        assert_aligned(target)
    _, target = mosaic(samples, (0.25, 0.5))
    assert len(target.labels) < 5  # a box cut away took its mask


def test_mixup_keeps_both_sets_of_masks_at_the_first_size():
    first = (torch.zeros(3, 64, 96, dtype=torch.uint8), target_of([[10, 10, 40, 30]], (64, 96)))
    second = (torch.zeros(3, 32, 48, dtype=torch.uint8), target_of([[4, 8, 20, 24], [30, 2, 44, 30]], (32, 48)))
    _, target = mixup(first, second, 0.5)
    assert target.masks.shape == (3, 64, 96)
    assert_aligned(target)


def test_resize_batch_resizes_masks_with_the_content():
    samples = [(torch.zeros(3, 96, 96), target_of([[10, 20, 50, 70]], (96, 96))),
               (torch.zeros(3, 64, 80), target_of([[5, 5, 30, 60], [40, 10, 78, 20]], (64, 80)))]
    batch = padded_batch(samples)
    assert [t.masks.shape[0] for t in batch.targets] == [1, 2]  # collate keeps each image's masks
    for size in (64, 128, 150):
        resized = resize_batch(batch, size)
        for target in resized.targets:
            assert_aligned(target)
        assert resized.targets[0].masks.shape[-2:] == (size, size)


def test_collate_keeps_masks_per_image():
    samples = [(torch.zeros(3, 30, 40), target_of([[1, 2, 10, 20]], (30, 40))),
               (torch.zeros(3, 20, 20), target_of([], (20, 20)))]
    batch = functools.partial(collate, block=8)(samples)
    assert batch.targets[0].masks.shape == (1, 30, 40) and batch.targets[1].masks.shape == (0, 20, 20)
    moved = batch.to("cpu")
    assert torch.equal(moved.targets[0].masks, samples[0][1].masks)
