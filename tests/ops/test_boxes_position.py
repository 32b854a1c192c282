"""Box conversions and the query sine embedding against direct formulas."""

import math

import torch

from detrkit.ops.boxes import apply_box_delta, cxcywh_to_xyxy, xyxy_to_cxcywh
from detrkit.ops.position import box_sine_embedding


def test_box_conversions_round_trip_and_values():
    boxes = torch.tensor([[0.5, 0.4, 0.2, 0.6]])
    xyxy = cxcywh_to_xyxy(boxes)
    torch.testing.assert_close(xyxy, torch.tensor([[0.4, 0.1, 0.6, 0.7]]))
    torch.testing.assert_close(xyxy_to_cxcywh(xyxy), boxes)


def test_box_delta_shifts_by_size_and_scales_exponentially():
    base = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    delta = torch.tensor([[1.0, -0.5, math.log(2.0), 0.0]])
    torch.testing.assert_close(apply_box_delta(delta, base), torch.tensor([[0.7, 0.3, 0.4, 0.4]]))


def test_sine_embedding_matches_formula():
    torch.manual_seed(0)
    boxes = torch.rand(3, 4)
    feats = 16
    out = box_sine_embedding(boxes, feats)
    assert out.shape == (3, 4 * feats)
    for n in range(3):
        for c, coord in enumerate((1, 0, 2, 3)):  # output order cy, cx, w, h
            for i in range(feats):
                angle = boxes[n, coord].item() * 2 * math.pi / 10000 ** (2 * (i // 2) / feats)
                expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
                assert abs(out[n, c * feats + i].item() - expected) < 1e-5
