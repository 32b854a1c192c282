"""Training/eval pipelines, the square crop, multi-scale sizes, batch scale and batch resize."""

from __future__ import annotations

import random

import pytest
import torch
from torchvision import tv_tensors

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from torchvision.transforms import v2

from detrkit.datasets.transforms import (RandomClippedCrop, RandomSquareCrop, batch_scale, build_eval_transform,
                                         build_train_resize, build_train_transform, multi_scale_sizes,
                                         resize_batch, sample_scales)
from detrkit.structures import Batch, Target


def sample(height: int, width: int, boxes: list[list[float]]) -> tuple[tv_tensors.Image, dict]:
    image = tv_tensors.Image(torch.randint(0, 256, (3, height, width), dtype=torch.uint8))
    target = {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes), format="XYXY", canvas_size=(height, width)),
              "labels": torch.arange(len(boxes)), "area": torch.ones(len(boxes))}
    return image, target


@pytest.mark.parametrize("name, resolution, block, first, last", [
    ("nano", 384, 32, 224, 544), ("small", 512, 32, 352, 672), ("medium", 576, 32, 416, 736),
    ("large", 704, 32, 544, 864), ("seg-nano", 312, 12, 252, 372), ("seg-small", 384, 24, 264, 504),
])
def test_multi_scale_sizes_match_the_published_examples(name, resolution, block, first, last):
    assert multi_scale_sizes(resolution, block) == list(range(first, last + 1, block))


def test_narrow_scales_and_the_two_block_floor():
    assert multi_scale_sizes(384, 32, expanded=False) == list(range(288, 513, 32))
    assert multi_scale_sizes(64, 32) == [64, 96, 128, 160, 192, 224]


def test_sample_scales_per_mode():
    assert sample_scales("off", 384, 32) == [384]
    assert sample_scales("per-batch", 384, 32) == [544]
    assert sample_scales("per-sample", 384, 32) == multi_scale_sizes(384, 32)
    with pytest.raises(ValueError, match="'sometimes'"):
        sample_scales("sometimes", 384, 32)


def test_batch_scale_is_a_pure_function_of_the_step():
    scales = multi_scale_sizes(384, 32)
    picks = [batch_scale(step, scales) for step in range(50)]
    assert picks == [batch_scale(step, scales) for step in range(50)]
    assert picks == [random.Random(step).choice(scales) for step in range(50)]
    assert len(set(picks)) > 5


def test_square_crop_side_is_bounded_by_the_image_and_boxes_are_clamped():
    torch.manual_seed(0)
    image, target = sample(300, 500, [[0.0, 0.0, 500.0, 300.0]])
    cropped, out = RandomSquareCrop()(image, target)
    assert cropped.shape[-2:] == (300, 300)  # side in [min(384, 300), 300]
    assert out["boxes"].tolist() == [[0.0, 0.0, 300.0, 300.0]]
    sides = {RandomSquareCrop()(*sample(700, 800, [[0.0, 0.0, 1.0, 1.0]]))[0].shape[-1] for _ in range(30)}
    assert min(sides) >= 384 and max(sides) <= 600 and len(sides) > 10


def test_clipped_crop_clips_the_side_to_each_dimension_as_randomsizedcrop_does():
    torch.manual_seed(0)
    windows = [RandomClippedCrop()(*sample(400, 533, [[0.0, 0.0, 533.0, 400.0]])) for _ in range(200)]
    shapes = [tuple(image.shape[-2:]) for image, _ in windows]
    # side uniform in [384, 600]: height min(side, 400), width min(side, 533)
    assert all((384 <= h < 400 and w == h) or (h == 400 and 400 <= w <= 533) for h, w in shapes)
    whole_height = sum(h == 400 for h, _ in shapes)
    assert 160 < whole_height < 200  # P(side >= 400) = 201 / 217 = 0.93
    assert 40 < sum(w == 533 for _, w in shapes) < 85  # P(side >= 533) = 68 / 217 = 0.31: the whole image
    for (image, out), (h, w) in zip(windows, shapes):
        assert out["boxes"].tolist() == [[0.0, 0.0, float(w), float(h)]]  # translated and clamped
    square = {tuple(RandomClippedCrop()(*sample(700, 800, [[0.0, 0.0, 1.0, 1.0]]))[0].shape[-2:]) for _ in range(30)}
    assert all(h == w and 384 <= h <= 600 for h, w in square) and len(square) > 10


def test_recipes_differ_in_window_and_antialiasing_only():
    torch.manual_seed(0)
    rows = torch.arange(240)[:, None] + torch.arange(320)[None, :]
    stripes = tv_tensors.Image((rows % 2 * 255).to(torch.uint8).expand(3, 240, 320).clone())
    target = {"boxes": tv_tensors.BoundingBoxes(torch.tensor([[10.0, 10.0, 300.0, 200.0]]), format="XYXY",
                                                 canvas_size=(240, 320)), "labels": torch.tensor([0])}
    sharp = build_train_resize([96], scale_jitter=False)(stripes, target)[0]
    smooth = build_train_resize([96], scale_jitter=False, recipe="torchvision")(stripes, target)[0]
    assert torch.equal(sharp, v2.Resize((96, 96), antialias=False)(stripes))
    assert torch.equal(smooth, v2.Resize((96, 96), antialias=True)(stripes))
    assert sharp.float().std() > 2 * smooth.float().std()  # aliased stripes against a near-flat grey
    windows = {recipe: [type(t) for t in build_train_resize([96], recipe=recipe).transforms[1].transforms]
               for recipe in ("default", "torchvision")}
    assert RandomClippedCrop in windows["default"] and RandomSquareCrop in windows["torchvision"]
    with pytest.raises(ValueError, match="'albumentations'"):
        build_train_resize([96], recipe="albumentations")


@pytest.mark.parametrize("square", [True, False])
def test_default_crop_branch_ends_square_at_the_scale(square):
    torch.manual_seed(1)
    resize = build_train_resize([128], square=square).transforms[1]  # branch B alone
    for _ in range(10):
        image, out = resize(*sample(240, 320, [[10.0, 10.0, 300.0, 200.0]]))
        assert image.shape[-2:] == (128, 128) and out["boxes"].canvas_size == (128, 128)


def test_train_pipeline_outputs_a_listed_scale_with_normalised_pixels():
    torch.manual_seed(0)
    transform = build_train_transform([64, 96])
    shapes = set()
    for _ in range(30):
        image, target = sample(700, 900, [[100.0, 100.0, 600.0, 500.0]])
        pixels, out = transform(tv_tensors.Image(torch.full_like(image, 255)), target)
        shapes.add(tuple(pixels.shape))
        assert out["boxes"].canvas_size == tuple(pixels.shape[-2:])
    assert shapes == {(3, 64, 64), (3, 96, 96)}
    white = (1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)  # ImageNet-normalised 1.0
    assert pixels.dtype == torch.float32
    torch.testing.assert_close(pixels.as_subclass(torch.Tensor), white.view(3, 1, 1).expand_as(pixels))


def test_aspect_keeping_eval_resize_caps_the_long_side():
    pixels, _ = build_eval_transform(600, square=False)(*sample(100, 400, [[0.0, 0.0, 1.0, 1.0]]))
    assert pixels.shape == (3, 333, 1333)


def test_resize_batch_resizes_pixels_and_mask_keeps_boxes():
    pixels = torch.ones(2, 3, 64, 64)
    padding = torch.zeros(2, 64, 64, dtype=torch.bool)
    padding[1, :, 32:] = True  # the second image is 64x32, padded on the right
    boxes = torch.tensor([[0.5, 0.5, 0.2, 0.2]])
    crowds = torch.tensor([[10.0, 10.0, 50.0, 40.0]])  # source pixels: no resize moves them
    targets = [Target(boxes, torch.tensor([0]), i, (100, 100), (64, 64 - 32 * i), crowd_boxes=crowds,
                      crowd_labels=torch.tensor([0])) for i in range(2)]
    out = resize_batch(Batch(pixels, padding, targets), 96)
    assert out.pixels.shape == (2, 3, 96, 96) and torch.allclose(out.pixels, torch.ones(()))
    assert out.padding.shape == (2, 96, 96) and not out.padding[0].any()
    assert out.padding[1, :, 48:].all() and not out.padding[1, :, :48].any()
    assert [t.size for t in out.targets] == [(96, 96), (96, 48)]
    assert out.targets[1].boxes is boxes and out.targets[1].orig_size == (100, 100)
    assert all(t.crowd_boxes is crowds for t in out.targets)
    assert resize_batch(Batch(pixels, None, targets), 32).padding is None
