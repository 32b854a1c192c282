"""The Kornia backend's fast paths against their slow twins, and its colour ops against Albumentations."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("kornia")

from kornia.color import hsv_to_rgb, rgb_to_hsv  # noqa: E402

from detrkit.datasets import kornia_ops  # noqa: E402
from detrkit.datasets.kornia import permute_pixels, pixel_permutation, warp  # noqa: E402

DIHEDRAL = [(flip_x, flip_y, degrees) for flip_x in (False, True) for flip_y in (False, True) for degrees in (0, 90)]


def turn_and_flip(size: torch.Tensor, flip_x: bool, flip_y: bool, degrees: float) -> torch.Tensor:
    """(3, 3): rotate about the centre, then flip, built from the ops themselves."""
    draws = kornia_ops.Draws(0, torch.device("cpu"))
    sizes = size[None]
    matrix = kornia_ops.Rotate(limit=(degrees, degrees), p=1.0).matrices(sizes, draws)
    if flip_x:
        matrix = kornia_ops.HorizontalFlip(p=1.0).matrices(sizes, draws) @ matrix
    if flip_y:
        matrix = kornia_ops.VerticalFlip(p=1.0).matrices(sizes, draws) @ matrix
    return matrix[0]


@pytest.mark.parametrize("flip_x, flip_y, degrees", DIHEDRAL)
def test_pixel_permutations_equal_the_warp(flip_x, flip_y, degrees):
    images = torch.rand(2, 3, 24, 24)
    matrix = turn_and_flip(torch.tensor([24.0, 24.0]), flip_x, flip_y, degrees)
    key = pixel_permutation(matrix, torch.tensor([24.0, 24.0]), (24, 24))
    assert key is not None
    torch.testing.assert_close(permute_pixels(images, *key), warp(images, matrix.expand(2, 3, 3)), atol=1e-5, rtol=0)


def test_warp_equals_kornias_warp_affine():
    from kornia.geometry.transform import warp_affine

    images = torch.rand(3, 3, 20, 28)
    draws = kornia_ops.Draws(1, torch.device("cpu"))
    affine = kornia_ops.Affine(scale=(0.7, 1.3), translate_percent=(-0.2, 0.2), rotate=(-40, 40), shear=(-10, 10),
                               p=1.0)
    matrix = affine.matrices(torch.tensor([[28.0, 20.0]] * 3), draws)
    to_index = torch.eye(3)
    to_index[:2, 2] = -0.5  # pixel index = continuous coordinate - 0.5
    index_matrix = to_index @ matrix @ torch.linalg.inv(to_index)
    expected = warp_affine(images, index_matrix[:, :2], dsize=(20, 28), align_corners=True)
    torch.testing.assert_close(warp(images, matrix), expected, atol=1e-4, rtol=0)


def test_pixel_permutation_declines_what_it_cannot_do_exactly():
    size = torch.tensor([32.0, 24.0])
    assert pixel_permutation(turn_and_flip(size, True, False, 0), size, (32, 24)) == (False, True, False)
    assert pixel_permutation(turn_and_flip(size, False, False, 90), size, (32, 24)) is None  # not square
    assert pixel_permutation(turn_and_flip(size, True, False, 0), size, (40, 24)) is None  # padded image
    assert pixel_permutation(turn_and_flip(size, False, False, 30), size, (32, 24)) is None
    shifted = torch.eye(3)
    shifted[0, 2] = 3
    assert pixel_permutation(shifted, size, (32, 24)) is None


def test_shift_hue_equals_the_hsv_round_trip():
    rgb = torch.rand(4, 3, 16, 16)
    rgb[0, :, :4] = 0.5  # grey: no hue
    rgb[1, 0, :4] = rgb[1, 1, :4]  # ties between channels
    turns = torch.tensor([0.1, -0.3, 0.5, 0.95])[:, None, None, None]
    hsv = rgb_to_hsv(rgb)
    hue = torch.remainder(hsv[:, :1] + turns * 2 * math.pi, 2 * math.pi)
    expected = hsv_to_rgb(torch.cat([hue, hsv[:, 1:]], 1))
    torch.testing.assert_close(kornia_ops.shift_hue(rgb, turns), expected, atol=1e-5, rtol=0)


def test_on_chosen_changes_only_the_chosen_images():
    images = torch.rand(5, 3, 4, 4)
    out = kornia_ops.on_chosen(images.clone(), None, torch.tensor([1, 3]), lambda part, _: part * 0)
    assert (out[[1, 3]] == 0).all() and torch.equal(out[[0, 2, 4]], images[[0, 2, 4]])
    assert kornia_ops.on_chosen(images, None, torch.tensor([], dtype=torch.int64), lambda p, _: p * 0) is images


def test_probabilities_choose_about_that_share_of_images():
    draws = kornia_ops.Draws(3, torch.device("cpu"))
    op = kornia_ops.ToGray(p=0.3)
    images = torch.rand(1000, 3, 2, 2)
    grey = op(images.clone(), None, draws)
    changed = (grey != images).flatten(1).any(1).float().mean().item()
    assert 0.25 < changed < 0.35


PINNED_COLOUR = [
    {"ColorJitter": {"brightness": (1.3, 1.3), "contrast": (1, 1), "saturation": (1, 1), "hue": (0, 0), "p": 1.0}},
    {"ColorJitter": {"brightness": (1, 1), "contrast": (0.6, 0.6), "saturation": (1, 1), "hue": (0, 0), "p": 1.0}},
    {"ColorJitter": {"brightness": (1, 1), "contrast": (1, 1), "saturation": (0.4, 0.4), "hue": (0, 0), "p": 1.0}},
    {"ColorJitter": {"brightness": (1, 1), "contrast": (1, 1), "saturation": (1, 1), "hue": (0.2, 0.2), "p": 1.0}},
    {"RandomGamma": {"gamma_limit": (70, 70), "p": 1.0}},
    {"ToGray": {"p": 1.0}},
    {"RandomBrightnessContrast": {"brightness_limit": (-0.1, -0.1), "contrast_limit": (0.3, 0.3),
                                  "brightness_by_max": False, "p": 1.0}},
]


@pytest.mark.parametrize("config", PINNED_COLOUR, ids=lambda c: next(iter(c)) + str(next(iter(c.values()))))
def test_colour_ops_match_albumentations_with_pinned_parameters(config):
    pytest.importorskip("albumentations")
    from detrkit.datasets.kornia import KorniaAugment
    from detrkit.structures import Batch, Target

    from test_augment_geometry import MEAN, STD, run_albumentations  # the shared runner

    generator = torch.Generator().manual_seed(0)
    image = torch.randint(20, 236, (3, 32, 48), dtype=torch.uint8, generator=generator)
    boxes = torch.tensor([[4.0, 4.0, 20.0, 20.0]])
    albu, _, _ = run_albumentations(config, image, boxes)
    target = Target(torch.tensor([[0.25, 0.375, 0.333, 0.5]]), torch.tensor([0]), 0, (32, 48), (32, 48))
    kornia = KorniaAugment(config)(Batch(image[None], None, [target])).pixels[0] * STD + MEAN
    # Albumentations works in uint8 (hue in OpenCV's 180 steps): a few levels apart at most
    assert (kornia - albu).abs().mean() < 1.5 / 255
    assert (kornia - albu).abs().max() < 6 / 255


@pytest.mark.gpu
def test_cuda_batches_match_cpu_batches():
    from detrkit.datasets.aug_configs import AUG_AERIAL
    from detrkit.datasets.kornia import KorniaAugment
    from detrkit.structures import Batch, Target

    config = {**AUG_AERIAL, "Affine": {"scale": (0.8, 1.2), "rotate": (-20, 20), "p": 0.5},
              "ColorJitter": {"p": 0.5}}
    pixels = torch.randint(0, 256, (6, 3, 64, 64), dtype=torch.uint8)
    targets = [Target(torch.tensor([[0.4, 0.5, 0.2, 0.3]]), torch.tensor([1]), i, (64, 64), (64, 64), torch.ones(1))
               for i in range(6)]
    augment = KorniaAugment(config)
    torch.manual_seed(0)
    cpu = augment(Batch(pixels, None, targets))
    torch.manual_seed(0)
    cuda = augment(Batch(pixels, None, targets).to("cuda"))
    torch.testing.assert_close(cuda.pixels.cpu(), cpu.pixels, atol=1e-3, rtol=0)
    for a, b in zip(cuda.targets, cpu.targets):
        torch.testing.assert_close(a.boxes.cpu(), b.boxes, atol=1e-5, rtol=0)
