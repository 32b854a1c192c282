"""OnePassCocoMeanAveragePrecision buckets ground truth by mask area in the box pass too, when
masks are evaluated: pycocotools with a COCO file whose `area` is the mask's, and torchmetrics."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from test_coco_map import ALL, MASKS, evaluate, max_difference, pycocotools_reference

_CANVAS = 100  # pixels, square


def _diagonal(x0, y0, length):
    """A 3-pixel-wide diagonal stroke: its box is length x length (medium from 32 on), its mask
    about 3 * length pixels (small below ~340)."""
    mask = torch.zeros(_CANVAS, _CANVAS, dtype=torch.bool)
    for step in range(length):
        mask[max(y0, y0 + step - 1) : min(y0 + length, y0 + step + 2), x0 + step] = True
    return mask


def _block(x0, y0, size):
    mask = torch.zeros(_CANVAS, _CANVAS, dtype=torch.bool)
    mask[y0 : y0 + size, x0 : x0 + size] = True
    return mask


def _item(masks, scores=None):
    """Boxes are the masks' pixel extents (xyxy); every label is 0."""
    masks = torch.stack(masks)
    boxes = []
    for mask in masks:
        ys, xs = mask.nonzero(as_tuple=True)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    item = {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.zeros(len(masks), dtype=torch.int64),
            "masks": masks}
    return item | ({"scores": torch.tensor(scores)} if scores is not None else {})


@pytest.fixture(scope="module")
def thin_state():
    """Ground truth: a diagonal stroke (box medium, mask small) and a 40 px block (medium both).
    Detections by score: a 25 px block on nothing (small), the stroke, a second stroke on
    nothing (box medium, mask small) and the block."""
    stroke, block = _diagonal(10, 10, 50), _block(0, 60, 40)
    target = _item([stroke, block])
    pred = _item([_block(70, 5, 25), stroke, _diagonal(50, 40, 50), block], [0.95, 0.9, 0.85, 0.7])
    return [pred], [target]


def test_the_stroke_lies_in_different_ranges_by_box_and_by_mask(thin_state):
    (pred,), (target,) = thin_state
    box = target["boxes"][0]
    assert 32**2 < (box[2] - box[0]) * (box[3] - box[1]) < 96**2  # medium
    assert target["masks"][0].sum() < 32**2  # small
    assert (pred["masks"][2].sum() < 32**2) and tuple(pred["boxes"][2, 2:] - pred["boxes"][2, :2]) == (50, 50)


@pytest.fixture(scope="module")
def expected(thin_state):
    """pycocotools with area = mask area in both passes (a COCO annotation file's `area`)."""
    return {kind: pycocotools_reference(*thin_state, iou_type=kind, mask_area=True) for kind in ("bbox", "segm")}


def test_the_reference_numbers_are_the_hand_counted_ones(thin_state, expected):
    # box pass, small: the block on nothing is a false positive before the stroke is found; the
    # second stroke's detection is medium by its box, so it is a false positive there instead
    assert (expected["bbox"]["map_small"], expected["bbox"]["map_medium"]) == (0.5, 0.5)
    # mask pass: the second stroke is small by its mask, and the block stands alone in medium
    assert expected["segm"]["map_small"] == 0.5
    assert expected["segm"]["map_medium"] == pytest.approx(1.0, abs=1e-15)  # a lone true positive: 1 - 2.2e-16
    by_box = pycocotools_reference(*thin_state, iou_type="bbox", mask_area=False)
    # bucketing by box area instead: no small ground truth; in medium the stroke is found first,
    # then the second stroke misses and the block is found: precision 1 to recall 0.5, then 2/3
    assert by_box["map_small"] == -1.0 and by_box["map_medium"] == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-15)


@pytest.mark.parametrize("backend", ALL)
def test_both_passes_bucket_by_mask_area(backend, thin_state, expected):
    result = evaluate(*thin_state, backend, class_metrics=True, iou_type=("bbox", "segm"))
    for iou_type in ("bbox", "segm"):
        assert max_difference(result, expected[iou_type], prefix=f"{iou_type}_") == 0.0, iou_type
    assert (result["bbox_map_small"].item(), result["bbox_map_medium"].item()) == (0.5, 0.5)
    assert (result["segm_map_small"].item(), result["segm_map_medium"].item()) == (0.5, 1.0)


@pytest.mark.parametrize("backend", MASKS)
def test_mask_only_pass_buckets_by_mask_area(backend, thin_state, expected):
    result = evaluate(*thin_state, backend, class_metrics=True, iou_type="segm")
    assert max_difference(result, expected["segm"]) == 0.0


def test_box_only_evaluation_still_buckets_by_box_area(thin_state):
    result = evaluate(*thin_state, "faster_coco_eval", iou_type="bbox")  # masks given, not evaluated
    expected = pycocotools_reference(*thin_state, iou_type="bbox", mask_area=False)
    del expected["map_per_class"], expected["mar_100_per_class"]
    assert max_difference(result, expected) == 0.0 and result["map_small"].item() == -1.0


def test_torchmetrics_buckets_the_same_way(thin_state):
    from torchmetrics.detection import MeanAveragePrecision

    reference = MeanAveragePrecision(iou_type=("bbox", "segm"), class_metrics=True)
    reference.update(*thin_state)
    with contextlib.redirect_stdout(io.StringIO()):
        theirs = reference.compute()
    ours = evaluate(*thin_state, "vernier", class_metrics=True, iou_type=("bbox", "segm"))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key].reshape(-1), theirs[key].reshape(-1)), (key, ours[key], theirs[key])
