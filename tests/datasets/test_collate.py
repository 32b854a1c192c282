"""collate: padding to a block multiple, the padding mask, and Target pass-through."""

from __future__ import annotations

import functools

import pytest
import torch

from detrkit.datasets.collate import collate
from detrkit.structures import Target


def target(image_id: int) -> Target:
    return Target(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), image_id, (1, 1), (1, 1))


def test_pads_to_the_rounded_batch_maximum_and_marks_padding():
    first, second = torch.full((3, 50, 70), 1.0), torch.full((3, 64, 30), 2.0)
    batch = collate([(first, target(0)), (second, target(1))], block=32)
    assert batch.pixels.shape == (2, 3, 64, 96) and batch.padding.shape == (2, 64, 96)
    assert batch.pixels[0, :, :50, :70].eq(1).all() and batch.pixels[0, :, 50:].eq(0).all()
    assert batch.pixels[1, :, :, :30].eq(2).all() and batch.pixels[1, :, :, 30:].eq(0).all()
    assert batch.padding.sum().item() == (64 * 96 - 50 * 70) + (64 * 96 - 64 * 30)
    assert not batch.padding[0, :50, :70].any() and batch.padding[0, 50:].all()
    assert [t.image_id for t in batch.targets] == [0, 1]


def test_padding_is_none_when_every_image_fills_the_block_grid():
    batch = collate([(torch.ones(3, 64, 32), target(0))] * 2, block=32)
    assert batch.padding is None and batch.pixels.shape == (2, 3, 64, 32)
    assert collate([(torch.ones(3, 60, 32), target(0))], block=32).padding is not None


def test_partial_works_as_a_dataloader_collate_fn():
    samples = [(torch.ones(3, 10, 10), target(i)) for i in range(3)]
    loader = torch.utils.data.DataLoader(samples, batch_size=3, collate_fn=functools.partial(collate, block=16))
    assert next(iter(loader)).pixels.shape == (3, 3, 16, 16)


def test_rejects_a_non_positive_block():
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        collate([(torch.ones(3, 4, 4), target(0))], block=0)
