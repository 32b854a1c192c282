"""Mask post-processing that skips work it can prove empty: masks without a positive logit are not
upsampled, and run-length encoding reads only the window where an upsampled mask can be set.
Both must give exactly what the dense computation gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detrkit.models.postprocess import masks_at_size, positive_windows
from detrkit.training.coco_backends.rle import EncodedMasks, encode_masks, encode_masks_in_windows


def _dense(logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return F.interpolate(logits[:, None], size=size, mode="bilinear", align_corners=False)[:, 0] > 0


def _cases(count: int):
    generator = torch.Generator().manual_seed(0)
    for trial in range(count):
        h, w = (int(v) for v in torch.randint(2, 30, (2,), generator=generator))
        size = tuple(int(v) for v in torch.randint(1, 160, (2,), generator=generator))
        logits = torch.randn(6, h, w, generator=generator) - 3 * float(torch.rand(1, generator=generator))
        if trial % 3 == 0:  # one positive logit per mask, at the centre and in the corners; one mask empty
            logits = torch.full((6, h, w), -1.0)
            logits[:, h // 2, w // 2] = 2.0
            logits[0] = -1.0
            logits[1, 0, 0] = logits[2, -1, -1] = 5.0
        yield logits, size


def test_masks_at_size_equals_dense_upsampling_with_empty_masks_skipped():
    for logits, size in _cases(120):
        assert torch.equal(masks_at_size(logits, tuple(logits.shape[-2:]), size), _dense(logits, size))
    logits = torch.randn(3, 8, 8)
    logits[1] = -torch.rand(8, 8)
    logits[1, 6:, 6:] = 3.0  # positive only outside the valid region: cropped away, so all False
    out = masks_at_size(logits, (6, 6), (20, 30))
    assert not out[1].any() and torch.equal(out, _dense(logits[:, :6, :6], (20, 30)))


def test_positive_windows_hold_every_set_pixel_and_shrink_to_the_positive_logits():
    for logits, size in _cases(200):
        dense = _dense(logits, size)
        windows = positive_windows(logits, size)
        for mask, (y0, y1, x0, x1) in zip(dense, windows.tolist()):
            outside = mask.clone()
            outside[y0:y1, x0:x1] = False
            assert not outside.any()
    logits = torch.full((2, 10, 10), -1.0)
    logits[0, 4, 5] = 1.0
    windows = positive_windows(logits, (100, 100)).tolist()
    assert windows[1] == [0, 0, 0, 0]  # no positive logit: an empty window
    y0, y1, x0, x1 = windows[0]  # one positive logit: a window about 2 source pixels wide, not the image
    assert 25 <= y0 < 40 < 50 < y1 <= 65 and 35 <= x0 < 50 < 60 < x1 <= 75


@pytest.mark.parametrize("shape", [(7, 9), (1, 5), (5, 1)])
def test_windowed_runs_equal_full_runs(shape):
    generator = torch.Generator().manual_seed(1)
    height, width = shape
    masks = torch.zeros(8, height, width, dtype=torch.bool)
    windows = []
    for index in range(8):
        y0, x0 = int(torch.randint(0, height, (1,), generator=generator)), int(torch.randint(0, width, (1,), generator=generator))
        y1 = int(torch.randint(y0, height + 1, (1,), generator=generator))
        x1 = int(torch.randint(x0, width + 1, (1,), generator=generator))
        masks[index, y0:y1, x0:x1] = torch.rand(y1 - y0, x1 - x0, generator=generator) < 0.6
        windows.append([y0, y1, x0, x1])
    masks[0], windows[0] = True, [0, height, 0, width]  # a run through every column boundary, ending set
    masks[1], windows[1] = False, [0, 0, 0, 0]
    masks[2, :, :], windows[2] = False, [0, height, 0, width]
    masks[2, 0, 0] = True  # starts set: a zero-length first run
    runs, lengths = encode_masks_in_windows(masks, torch.tensor(windows))
    want_runs, want_lengths = encode_masks(masks)
    assert torch.equal(runs, want_runs) and torch.equal(lengths, want_lengths)
    encoded = EncodedMasks.encode(masks, torch.tensor(windows))
    assert encoded.size == shape and torch.equal(encoded.runs, want_runs)


def test_windowed_encoding_of_upsampled_masks_equals_dense_encoding():
    for logits, size in _cases(60):
        dense = _dense(logits, size)
        runs, lengths = encode_masks_in_windows(dense, positive_windows(logits, size))
        want_runs, want_lengths = encode_masks(dense)
        assert torch.equal(runs, want_runs) and torch.equal(lengths, want_lengths)
    empty = encode_masks_in_windows(torch.zeros(0, 4, 4, dtype=torch.bool), torch.zeros(0, 4, dtype=torch.long))
    assert empty[0].numel() == 0 and empty[1].numel() == 0
