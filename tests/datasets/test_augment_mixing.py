"""Mosaic and mixup: where tiles and boxes land, blending, and when the data set applies them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from detrkit.datasets.mixing import MIN_VISIBLE, MixedSamples, mixup, mosaic
from detrkit.ops.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.structures import Target
from detrkit.training.sampling import EpochSampler, EpochTagged, SeededSamples


def rectangle_sample(rectangle: list[int], height: int = 64, width: int = 96, image_id: int = 0,
                     dtype: torch.dtype = torch.uint8) -> tuple[torch.Tensor, Target]:
    x0, y0, x1, y1 = rectangle
    pixels = torch.zeros(3, height, width, dtype=dtype)
    pixels[:, y0:y1, x0:x1] = 255 if dtype == torch.uint8 else 1.0
    scale = torch.tensor([width, height, width, height], dtype=torch.float32)
    boxes = xyxy_to_cxcywh(torch.tensor([rectangle], dtype=torch.float32)) / scale
    return pixels, Target(boxes, torch.tensor([image_id]), image_id, (height, width), (height, width),
                          torch.tensor([float((x1 - x0) * (y1 - y0))]))


def pixel_boxes(target: Target) -> torch.Tensor:
    height, width = target.size
    return cxcywh_to_xyxy(target.boxes) * torch.tensor([width, height, width, height])


def test_mosaic_at_the_centre_places_four_half_size_tiles():
    samples = [rectangle_sample([16, 8, 64, 40], image_id=i) for i in range(4)]
    pixels, target = mosaic(samples, (0.5, 0.5))
    assert pixels.shape == (3, 64, 96) and pixels.dtype == torch.uint8
    assert target.labels.tolist() == [0, 1, 2, 3] and target.image_id == 0 and target.size == (64, 96)
    expected = torch.tensor([[8, 4, 32, 20], [56, 4, 80, 20], [8, 36, 32, 52], [56, 36, 80, 52]], dtype=torch.float32)
    torch.testing.assert_close(pixel_boxes(target), expected)
    bright = pixels[0] > 127
    for x0, y0, x1, y1 in expected.int().tolist():  # each half-size rectangle fills its box
        assert (pixels[:, y0 + 1:y1 - 1, x0 + 1:x1 - 1] == 255).all() and bright[y0:y1, x0:x1].all()
        bright[y0:y1, x0:x1] = False
    assert not bright.any()


def test_mosaic_off_centre_cuts_tiles_and_drops_boxes_mostly_cut_away():
    # the top-left tile is shifted 24 px left of the canvas: its rectangle at x 0..16 of the
    # half-size tile loses all of it; the second tile's rectangle keeps 8 of its 16 px
    rectangles = [[0, 0, 32, 32], [64, 0, 96, 32], [0, 32, 96, 64], [32, 16, 64, 48]]
    samples = [rectangle_sample(rectangle, image_id=i) for i, rectangle in enumerate(rectangles)]
    pixels, target = mosaic(samples, (0.25, 0.5))  # centre (24, 32)
    boxes = pixel_boxes(target)
    assert 0 not in target.labels.tolist()
    assert ((boxes[:, 0] >= 0) & (boxes[:, 2] <= 96) & (boxes[:, 1] >= 0) & (boxes[:, 3] <= 64)).all()
    bright = pixels[0] > 127
    for x0, y0, x1, y1 in boxes.round().int().tolist():
        bright[y0:y1, x0:x1] = False
    assert not bright[:, 1:].any()  # every bright pixel left is inside some box (column 0: antialias edge)
    assert MIN_VISIBLE == 0.25


def test_mixup_blends_pixels_and_keeps_both_sets_of_boxes():
    a = rectangle_sample([0, 0, 32, 32], dtype=torch.float32)
    b = rectangle_sample([24, 8, 48, 24], height=32, width=48, image_id=7, dtype=torch.float32)  # half size
    pixels, target = mixup(a, b, 0.75)
    assert pixels.shape == (3, 64, 96)
    assert pixels[0, 5, 5].item() == pytest.approx(0.75) and pixels[0, 60, 5].item() == 0
    assert pixels[0, 40, 70].item() == pytest.approx(0.25)
    assert target.labels.tolist() == [0, 7] and target.image_id == 0 and len(target.crowd_boxes) == 0
    torch.testing.assert_close(target.boxes[1], b[1].boxes[0])  # normalised boxes survive the resize


class Shapes(Dataset):
    """Sample i: one rectangle whose position depends on a draw from the seeded generator."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int):
        left = int(torch.randint(0, 40, ()))
        return rectangle_sample([left, 8, left + 40, 40], image_id=index)


def test_mixed_samples_follow_the_seed_and_stop_for_the_last_epochs():
    samples = MixedSamples(SeededSamples(Shapes()), mosaic_p=1.0, mixup_p=0.0, until_epoch=3)
    first = samples[(1, 42, 0)]
    again = samples[(1, 42, 2)]
    assert torch.equal(first[0], again[0]) and torch.equal(first[1].boxes, again[1].boxes)
    assert len(first[1].labels) >= 3 and first[1].labels[0] == 1  # a mosaic led by sample 1
    plain = samples[(1, 42, 3)]  # closed: the sample as the inner data set gives it
    inner = SeededSamples(Shapes())[(1, 42)]
    assert torch.equal(plain[0], inner[0]) and plain[1].labels.tolist() == [1]
    assert not torch.equal(samples[(1, 43, 0)][0], first[0])
    assert len(samples) == 5


def test_mixup_probability_and_combined_draws():
    both = MixedSamples(SeededSamples(Shapes()), mosaic_p=0.0, mixup_p=1.0, until_epoch=10)
    pixels, target = both[(0, 1, 0)]
    assert len(target.labels) == 2 and pixels.dtype == torch.uint8
    never = MixedSamples(SeededSamples(Shapes()), mosaic_p=0.0, mixup_p=0.0, until_epoch=10)
    assert len(never[(0, 1, 0)][1].labels) == 1
    half = MixedSamples(SeededSamples(Shapes()), mosaic_p=0.5, mixup_p=0.0, until_epoch=10)
    mosaics = sum(len(half[(0, seed, 0)][1].labels) > 1 for seed in range(200))
    assert 70 < mosaics < 130


def test_epoch_tagged_keys_carry_the_sampler_epoch():
    sampler = EpochSampler(6, seed=0, window=2)
    tagged = EpochTagged(sampler)
    tagged.set_epoch(4)
    keys = list(tagged)
    assert len(keys) == len(tagged) == 6
    assert [key[:2] for key in keys] == list(sampler) and {key[2] for key in keys} == {4}
