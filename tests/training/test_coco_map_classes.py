"""OnePassCocoMeanAveragePrecision's class ids: `num_classes` lists every class, labels must be integers."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from test_coco_map import ALL, _image, evaluate, random_state

from detrkit.training.coco_backends.base import COCO_IOU_THRESHOLDS, COCO_RECALL_THRESHOLDS
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision

_NUM_CLASSES = 9  # random_state's labels are 0 .. 6; 7 and 8 never occur


@pytest.fixture(scope="module")
def integer_state():
    """random_state scaled 4x to whole-pixel boxes, so torchmetrics' float32 xyxy -> xywh is exact.
    Classes 2 and 5 are only predicted, class 6 only in the ground truth."""
    preds, targets = random_state(seed=3, images=40)
    for item in preds + targets:
        boxes = (item["boxes"] * 4).round()
        boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        item["boxes"] = boxes
    return preds, targets


@pytest.fixture(scope="module")
def torchmetrics_result(integer_state):
    """torchmetrics on pycocotools, given pycocotools' float64 grids (its own are float32 linspace)."""
    from torchmetrics.detection import MeanAveragePrecision

    metric = MeanAveragePrecision(class_metrics=True, iou_thresholds=list(COCO_IOU_THRESHOLDS),
                                  rec_thresholds=list(COCO_RECALL_THRESHOLDS))
    metric.update(*integer_state)
    with contextlib.redirect_stdout(io.StringIO()):
        return metric.compute()


@pytest.mark.parametrize("backend", ALL)
def test_num_classes_gives_one_entry_per_class(backend, integer_state, torchmetrics_result):
    theirs = torchmetrics_result
    assert theirs["classes"].tolist() == [0, 1, 2, 3, 4, 5, 6]  # torchmetrics: the observed labels only
    ours = evaluate(*integer_state, backend, class_metrics=True, num_classes=_NUM_CLASSES)
    assert ours["classes"].tolist() == list(range(_NUM_CLASSES)) and ours["classes"].dtype == torch.int32
    for key in ("map_per_class", "mar_100_per_class"):
        assert ours[key].shape == (_NUM_CLASSES,) and ours[key].dtype == torch.float32
        observed = ours[key][theirs["classes"].long()]
        assert torch.equal(observed, theirs[key]), (key, observed, theirs[key])
        assert ours[key][[2, 5]].tolist() == [-1.0, -1.0] and ours[key][6].item() == 0.0  # predicted only; never found
        assert ours[key][7:].tolist() == [-1.0, -1.0]  # never seen: no ground truth, so -1
    for key in theirs.keys() - {"classes", "map_per_class", "mar_100_per_class"}:
        assert torch.equal(ours[key], theirs[key]), (key, ours[key], theirs[key])
    assert ours["map"].item() > 0.04 and min(ours["map_per_class"][[0, 1, 3, 4]].tolist()) > 0.04  # a state that tests


def test_num_classes_leaves_the_aggregate_numbers_alone(integer_state):
    plain = evaluate(*integer_state, "vernier", class_metrics=True)
    padded = evaluate(*integer_state, "vernier", class_metrics=True, num_classes=_NUM_CLASSES)
    for key in plain.keys() - {"classes", "map_per_class", "mar_100_per_class"}:
        assert torch.equal(plain[key], padded[key]), key
    assert torch.equal(padded["map_per_class"][plain["classes"].long()], plain["map_per_class"])
    unranked = evaluate(*integer_state, "vernier", num_classes=_NUM_CLASSES)  # class_metrics off: sentinels
    assert unranked["map_per_class"].item() == -1.0 and unranked["classes"].tolist() == list(range(_NUM_CLASSES))


@pytest.mark.parametrize("backend", ALL)
def test_num_classes_without_ground_truth_or_updates(backend):
    pred, target = _image([[0, 0, 10, 10]], [1], [0.9]), _image([], [])
    result = evaluate([pred], [target], backend, class_metrics=True, num_classes=3)
    assert result["map_per_class"].tolist() == [-1.0, -1.0, -1.0] and result["map"].item() == -1.0
    with pytest.warns(UserWarning, match="compute"):
        empty = OnePassCocoMeanAveragePrecision(class_metrics=True, num_classes=3, backend=backend).compute()
    assert empty["classes"].tolist() == [0, 1, 2] and empty["mar_100_per_class"].tolist() == [-1.0] * 3


@pytest.mark.parametrize("label", [3, -1])
def test_labels_outside_num_classes_are_refused(label):
    metric = OnePassCocoMeanAveragePrecision(num_classes=3)
    metric.update([_image([[0, 0, 10, 10]], [label], [0.9])], [_image([[0, 0, 10, 10]], [0])])
    with pytest.raises(ValueError, match=rf"labels \[{label}\] lie outside 0 \.\. 2 \(num_classes=3\)"):
        metric.compute()


@pytest.mark.parametrize("value", [0, -2, 2.0, True, "3"])
def test_num_classes_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match="num_classes"):
        OnePassCocoMeanAveragePrecision(num_classes=value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
@pytest.mark.parametrize("side", ["preds", "targets"])
def test_labels_must_be_integers(side, dtype):
    metric = OnePassCocoMeanAveragePrecision()
    good_pred, good_target = _image([[0, 0, 10, 10]], [1], [0.9]), _image([[0, 0, 10, 10]], [1])
    preds, targets = [good_pred, dict(good_pred)], [good_target, dict(good_target)]
    bad = preds if side == "preds" else targets
    bad[1]["labels"] = bad[1]["labels"].to(dtype)
    with pytest.raises(ValueError, match=rf"{side}\[1\]\['labels'\] must hold integer class ids, got dtype {dtype}"):
        metric.update(preds, targets)
    assert metric.det_labels == []  # nothing of the refused batch is kept
    for integer in (torch.uint8, torch.int32):
        bad[1]["labels"] = bad[1]["labels"].to(integer)
        metric.update(preds, targets)
    assert np.isclose(metric.compute()["map"].item(), 1.0)


@pytest.mark.parametrize("kwargs, words", [({"average": "micro"}, "average='macro'"),
                                           ({"sync_on_compute": True}, "sync_on_compute=False"),
                                           ({"dist_sync_on_step": True}, "dist_sync_on_step=False"),
                                           ({"extended_summary": True}, "extended_summary"),
                                           ({"prefix": "val/"}, "Unexpected keyword")])
def test_unsupported_torchmetrics_options_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        OnePassCocoMeanAveragePrecision(**kwargs)


def test_torchmetrics_synchronisation_is_off_by_default():
    metric = OnePassCocoMeanAveragePrecision(sync_on_compute=False, compute_on_cpu=True)
    assert metric.sync_on_compute is False and metric.dist_sync_on_step is False and metric.compute_on_cpu is True
    assert OnePassCocoMeanAveragePrecision().sync_on_compute is False
