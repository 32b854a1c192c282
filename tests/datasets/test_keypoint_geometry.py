"""Keypoints follow their boxes through every transform path: each visible keypoint stays inside its
transformed box (within a pixel; 2 for rotations), known points land where the geometry sends
them, mirrors swap left and right slots, keypoints that leave the image become (0, 0, 0), and a
dropped box takes its keypoints with it.

Every rectangle carries its four corner pixels as keypoints top_left, top_right, bottom_right,
bottom_left (pixel i centred on i). Whatever rotates or mirrors the image, slots 0 -> 1 -> 2 must
keep turning clockwise on screen: a mirror reverses the turn and the left/right swap restores it.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from tiny_data import write_image
from torchvision.transforms import v2

from detrkit.datasets.collate import collate
from detrkit.datasets.detection import DetectionDataset, ImageRecord
from detrkit.datasets.keypoint_schema import KeypointFlip
from detrkit.datasets.keypoints import MirrorFlip, mark_sample
from detrkit.datasets.mixing import mixup, mosaic
from detrkit.datasets.transforms import (
    RandomSquareCrop,
    build_eval_transform,
    build_train_resize,
    build_train_transform,
    resize_batch,
)
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Batch, Target

pytest.importorskip("albumentations")
pytest.importorskip("kornia")

from detrkit.datasets.albumentations import AlbumentationsTransform
from detrkit.datasets.kornia import KorniaAugment

FLIP = KeypointFlip(((0, 1), (2, 3)))  # top_left <-> top_right, bottom_right <-> bottom_left
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


def corners(rectangle: list[int]) -> list[list[float]]:
    x0, y0, x1, y1 = rectangle
    return [[x0, y0], [x1 - 1, y0], [x1 - 1, y1 - 1], [x0, y1 - 1]]


def corner_keypoints(rectangles: list[list[int]], size: tuple[int, int]) -> torch.Tensor:
    """(N, 4, 3) normalised corner keypoints, all visible."""
    height, width = size
    points = torch.tensor([corners(r) for r in rectangles], dtype=torch.float32).reshape(-1, 4, 2)
    return torch.cat([points / torch.tensor([width, height]), torch.full((len(points), 4, 1), 2.0)], -1)


def keypoint_dataset(tmp_path, transform, rectangles=RECTANGLES, size=(500, 700), keypoints=None) -> DetectionDataset:
    """One noise image with rectangles labelled 0..n-1 (so kept rows can be told apart)."""
    height, width = size
    image = write_image(tmp_path / "a.png", width, height)
    points = corner_keypoints(rectangles, size) if keypoints is None else keypoints
    record = ImageRecord(path=image, image_id=0, size=size, iscrowd=np.zeros(len(rectangles), dtype=bool),
                         boxes=np.array(rectangles, dtype=np.float32) / [width, height, width, height],
                         labels=np.arange(len(rectangles)), keypoints=points.numpy())
    return DetectionDataset([record], ["a"] * len(rectangles), transform)


def target_of(rectangles: list[list[int]], size: tuple[int, int]) -> Target:
    height, width = size
    boxes = torch.tensor(rectangles, dtype=torch.float32).reshape(-1, 4)
    boxes = xyxy_to_cxcywh(boxes) / torch.tensor([width, height] * 2)
    return Target(boxes, torch.arange(len(rectangles)), 0, size, size, torch.ones(len(rectangles)),
                  keypoints=corner_keypoints(rectangles, size))


def pixel_keypoints(target: Target) -> torch.Tensor:
    height, width = target.size
    return target.keypoints * torch.tensor([width, height, 1.0])


def assert_in_boxes(target: Target, tolerance: float = 1.0) -> None:
    """Visible keypoints inside their boxes; the others exactly (0, 0, 0); one row per box."""
    height, width = target.size
    assert target.keypoints.shape == (len(target.labels), 4, 3)
    boxes = cxcywh_to_xyxy(target.boxes) * torch.tensor([width, height, width, height])
    for box, points in zip(boxes, pixel_keypoints(target)):
        visible = points[:, 2] > 0
        assert (points[~visible] == 0).all()
        xy = points[visible, :2]
        assert (xy >= box[:2] - tolerance).all() and (xy <= box[2:] + tolerance).all(), (box, xy)


def assert_turning_kept(target: Target) -> None:
    """top_left -> top_right -> bottom_right turns clockwise on screen in every fully visible row."""
    for points in pixel_keypoints(target):
        if (points[:3, 2] > 0).all():
            first, second = points[1, :2] - points[0, :2], points[2, :2] - points[0, :2]
            assert first[0] * second[1] - first[1] * second[0] > 0, points


def test_default_pipeline_moves_keypoints_with_boxes(tmp_path):
    dataset = keypoint_dataset(tmp_path, build_train_transform([320, 384, 448], True, True, 0.5, FLIP))
    dropped = cut = 0
    for seed in range(24):
        torch.manual_seed(seed)
        _, target = dataset[0]
        assert_in_boxes(target)
        assert_turning_kept(target)
        dropped += len(target.labels) < len(RECTANGLES)
        cut += bool((target.keypoints[..., 2] == 0).any())
    assert dropped and cut, "no crop dropped a box or cut a keypoint: the test does not cover them"


def test_flip_mirrors_a_known_point_and_swaps_left_and_right(tmp_path):
    dataset = keypoint_dataset(tmp_path, v2.Compose([v2.Resize((250, 350)), MirrorFlip(1.0, FLIP)]))
    _, target = dataset[0]
    # top_left (40, 30) -> resized (20, 15) -> mirrored x = 349 - 20, now the top right corner
    torch.testing.assert_close(pixel_keypoints(target)[0, 1], torch.tensor([329.0, 15.0, 2.0]))
    torch.testing.assert_close(pixel_keypoints(target)[0, 0], torch.tensor([349 - 99.5, 15.0, 2.0]))
    assert_in_boxes(target)
    assert_turning_kept(target)


def test_flip_without_a_flip_map_refuses_keypoints(tmp_path):
    dataset = keypoint_dataset(tmp_path, v2.Compose([MirrorFlip(1.0)]))
    with pytest.raises(ValueError, match="no keypoint flip map"):
        dataset[0]


class FixedCrop(RandomSquareCrop):
    def make_params(self, flat_inputs):
        return {"top": 100, "left": 250, "height": 300, "width": 300}


def test_crop_zeroes_keypoints_it_cuts_off_and_a_flip_keeps_them_zero(tmp_path):
    points = corner_keypoints(RECTANGLES, (500, 700))
    points[2, 0, :2] = torch.tensor([249.5 / 700, 400 / 500])  # half a pixel left of the crop: x -0.5
    dataset = keypoint_dataset(tmp_path, v2.Compose([FixedCrop(), mark_sample, MirrorFlip(1.0, FLIP)]),
                               keypoints=points)
    _, target = dataset[0]
    assert target.labels.tolist() == [1, 2]  # rectangle 0 lies left of the crop: dropped with its keypoints
    kept = pixel_keypoints(target)
    assert (kept[0, :2] == 0).all()  # the top corners of rectangle 1 (y = 60) are above the crop
    # bottom_left (300, 299) -> cropped (50, 199) -> mirrored (249, 199), now bottom right (slot 2)
    torch.testing.assert_close(kept[0, 2], torch.tensor([249.0, 199.0, 2.0]))
    assert (kept[1, 1] == 0).all()  # the -0.5 point (now top right) would land at 299.5, inside, unmarked
    assert_in_boxes(target)


def test_eval_transform_scales_keypoints(tmp_path):
    _, target = keypoint_dataset(tmp_path, build_eval_transform(250, square=False))[0]
    assert target.size == (250, 350)
    torch.testing.assert_close(pixel_keypoints(target)[0, 0], torch.tensor([20.0, 15.0, 2.0]))
    assert_in_boxes(target)


def test_unlabelled_and_occluded_keypoints_keep_their_flags(tmp_path):
    points = corner_keypoints(RECTANGLES, (500, 700))
    points[0, 3] = 0
    points[1, 3, 2] = 1
    _, target = keypoint_dataset(tmp_path, build_eval_transform(250), keypoints=points)[0]
    assert (target.keypoints[0, 3] == 0).all() and target.keypoints[1, 3, 2] == 1


@pytest.mark.parametrize("name", GEOMETRY)
def test_albumentations_moves_keypoints_with_boxes(tmp_path, name):
    resize = build_train_resize([384], square=False, scale_jitter=False)
    dataset = keypoint_dataset(tmp_path, AlbumentationsTransform(resize, GEOMETRY[name], FLIP), CENTRED)
    for seed in range(6):
        torch.manual_seed(seed)
        _, target = dataset[0]
        assert len(target.labels) == len(CENTRED)
        assert_in_boxes(target, tolerance=2.0 if name in ("Rotate", "Affine") else 1.0)
        assert_turning_kept(target)


@pytest.mark.parametrize("name, expected", [("HorizontalFlip", (536 - 268.5, 181 * 384 / 500)),
                                            ("VerticalFlip", (268.5, 383 - 181 * 384 / 500))])
def test_albumentations_mirrors_a_known_point(tmp_path, name, expected):
    resize = build_train_resize([384], square=False, scale_jitter=False)  # 500 x 700 -> 384 x 537
    dataset = keypoint_dataset(tmp_path, AlbumentationsTransform(resize, GEOMETRY[name], FLIP), [[350, 181, 420, 280]])
    _, target = dataset[0]
    # top_left (350, 181) -> resized (268.5, 139.0) -> mirrored, and relabelled top_right (slot 1)
    torch.testing.assert_close(pixel_keypoints(target)[0, 1, :2], torch.tensor(expected), atol=1e-3, rtol=0)


def test_albumentations_drops_keypoints_with_boxes_pushed_away(tmp_path):
    config = {"Affine": {"translate_percent": (0.45, 0.45), "p": 1.0}}
    resize = build_train_resize([500], square=False, scale_jitter=False)
    _, target = keypoint_dataset(tmp_path, AlbumentationsTransform(resize, config, FLIP))[0]
    assert target.labels.tolist() == [0, 1]
    assert_in_boxes(target)
    assert (target.keypoints[1, 2:, 2] == 0).all()  # rectangle 1's bottom corners went below the image


def padded_batch(samples: list[tuple[torch.Tensor, Target]]) -> Batch:
    return collate(samples, block=16)


def kornia_samples() -> tuple[list, list]:
    big, small = [[60, 40, 100, 80], [20, 50, 50, 70]], [[20, 16, 44, 40]]
    samples = [(torch.zeros(3, 120, 160, dtype=torch.uint8), target_of(big, (120, 160))),
               (torch.zeros(3, 60, 64, dtype=torch.uint8), target_of(small, (60, 64)))]
    return samples, [big, small]


@pytest.mark.parametrize("name", GEOMETRY)
def test_kornia_moves_keypoints_of_a_padded_batch_with_their_boxes(name):
    samples, rectangles = kornia_samples()
    for seed in range(6):
        torch.manual_seed(seed)
        out = KorniaAugment(GEOMETRY[name], FLIP)(padded_batch(samples))
        for target, expected in zip(out.targets, rectangles):
            assert len(target.labels) == len(expected)
            assert_in_boxes(target, tolerance=1.0)
            assert_turning_kept(target)


@pytest.mark.parametrize("name, expected", [("HorizontalFlip", (159.0 - 60, 40.0, 1)),
                                            ("VerticalFlip", (60.0, 119.0 - 40, 1))])
def test_kornia_mirrors_a_known_point(name, expected):
    samples, _ = kornia_samples()
    out = KorniaAugment(GEOMETRY[name], FLIP)(padded_batch(samples))
    x, y, slot = expected  # top_left (60, 40) of the 160 x 120 image; either mirror swaps it to slot 1
    torch.testing.assert_close(pixel_keypoints(out.targets[0])[0, slot], torch.tensor([x, y, 2.0]))


def test_kornia_refuses_to_mirror_keypoints_without_a_flip_map():
    samples, _ = kornia_samples()
    with pytest.raises(ValueError, match="no keypoint flip map"):
        KorniaAugment(GEOMETRY["HorizontalFlip"])(padded_batch(samples))


def test_kornia_drops_keypoints_with_boxes_pushed_away():
    config = {"Affine": {"translate_percent": (0.45, 0.45), "p": 1.0}}
    rectangles = [[10, 10, 120, 110], [120, 10, 150, 40]]
    sample = (torch.zeros(3, 120, 160, dtype=torch.uint8), target_of(rectangles, (120, 160)))
    target = KorniaAugment(config, FLIP)(padded_batch([sample])).targets[0]
    assert target.labels.tolist() == [0] and target.keypoints.shape == (1, 4, 3)
    assert_in_boxes(target)
    assert target.keypoints[0, 0, 2] == 2 and (target.keypoints[0, 2, :] == 0).all()  # 72 px right, 54 down


def test_mosaic_places_keypoints_and_zeroes_the_cut_ones():
    rectangles = [[[0, 0, 32, 32], [40, 10, 90, 50]], [[64, 0, 96, 32]], [[0, 32, 96, 64]], [[32, 16, 64, 48]]]
    samples = [(torch.zeros(3, 64, 96, dtype=torch.uint8), target_of(r, (64, 96))) for r in rectangles]
    for centre in ((0.5, 0.5), (0.25, 0.5), (0.7, 0.3)):
        _, target = mosaic(samples, centre)
        assert_in_boxes(target)
        assert_turning_kept(target)
    _, target = mosaic(samples, (0.5, 0.5))  # tiles 48 x 32, the first with its top left corner at (0, 0)
    torch.testing.assert_close(pixel_keypoints(target)[1, 0], torch.tensor([40 / 2, 10 / 2, 2.0]))
    _, target = mosaic(samples, (0.25, 0.5))  # the first tile starts at x = -24: its left corners are cut
    assert len(target.labels) < 5 and (target.keypoints[0, 0] == 0).all()


def test_mixup_keeps_both_sets_of_keypoints():
    first = (torch.zeros(3, 64, 96, dtype=torch.uint8), target_of([[10, 10, 40, 30]], (64, 96)))
    second = (torch.zeros(3, 32, 48, dtype=torch.uint8), target_of([[4, 8, 20, 24], [30, 2, 44, 30]], (32, 48)))
    _, target = mixup(first, second, 0.5)
    assert target.keypoints.shape == (3, 4, 3)
    torch.testing.assert_close(target.keypoints[1:], second[1].keypoints)  # normalised: a resize keeps them
    assert_in_boxes(target)


def test_resize_batch_and_collate_keep_normalised_keypoints():
    samples = [(torch.zeros(3, 96, 96), target_of([[10, 20, 50, 70]], (96, 96))),
               (torch.zeros(3, 64, 80), target_of([[5, 5, 30, 60], [40, 10, 78, 20]], (64, 80)))]
    batch = functools.partial(collate, block=16)(samples)
    assert [t.keypoints.shape[0] for t in batch.targets] == [1, 2]
    for size in (64, 150):
        for target, (_, source) in zip(resize_batch(batch, size).targets, samples):
            torch.testing.assert_close(target.keypoints, source.keypoints)
            assert_in_boxes(target, tolerance=1.5)
