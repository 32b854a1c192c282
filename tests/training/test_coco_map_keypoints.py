"""OnePassCocoMeanAveragePrecision(iou_type="keypoints"): OKS keypoint AP equal to pycocotools' COCOeval."""

from __future__ import annotations

import contextlib
import io
import math
import re

import numpy as np
import pytest
import torch
from test_coco_map import ALL, _BACKENDS

from detrkit.training.coco_backends.keypoints import COCO_PERSON_SIGMAS
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision

# COCOeval's keypoint summary (stats[0..9]) under our keys
_KEYS = ("map", "map_50", "map_75", "map_medium", "map_large", "mar_20", "mar_50", "mar_75", "mar_medium", "mar_large")


def keypoint_state(seed=0, images=40, keypoints=5, classes=3, dets=30, gts=6):
    """Ground truth with crowds, given areas, unlabelled keypoints and some with none labelled;
    detections near it (noisy, in all three OKS regimes) and stray ones, score ties, images
    without detections (every 7th) or ground truth (every 11th), more than 20 detections on
    some images, and classes only predicted (2 and 3)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=generator)

    preds, targets = [], []
    for index in range(images):
        num_gts = int(torch.randint(0, gts + 1, (1,), generator=generator)) if index % 11 else 0
        num_dets = int(torch.randint(0, dets + 1, (1,), generator=generator)) if index % 7 else 0
        corner = rand(num_gts, 2) * 300
        size = 4 + rand(num_gts, 2) ** 2 * 250
        boxes = torch.cat([corner, corner + size], 1)
        points = corner[:, None] + rand(num_gts, keypoints, 2) * size[:, None]
        visibility = torch.randint(0, 3, (num_gts, keypoints), generator=generator).float()
        visibility[rand(num_gts) < 0.15] = 0  # no keypoint labelled
        points = points * (visibility[..., None] > 0)  # unlabelled keypoints at (0, 0), as COCO files hold them
        labels = torch.randint(0, classes, (num_gts,), generator=generator)
        labels = labels + (labels == 2).long() * 4  # class 6: ground truth only
        target = {"boxes": boxes, "labels": labels, "iscrowd": (rand(num_gts) < 0.1).long(),
                  "keypoints": torch.cat([points, visibility[..., None]], -1)}
        if index % 2:
            target["area"] = size.prod(1) * (0.3 + rand(num_gts))
        near = torch.randint(0, max(num_gts, 1), (num_dets,), generator=generator)
        stray = (rand(num_dets) < 0.4) | (num_gts == 0)
        noise = torch.randn(num_dets, keypoints, 2, generator=generator) * (1 + 10 * rand(num_dets, 1, 1))
        det_points = (points[near] + noise) if num_gts else torch.zeros(num_dets, keypoints, 2)
        det_points = torch.where(stray[:, None, None], rand(num_dets, keypoints, 2) * 500, det_points)
        det_labels = labels[near] if num_gts else torch.zeros(num_dets, dtype=torch.long)
        det_labels = torch.where(stray, torch.randint(0, classes + 1, (num_dets,), generator=generator), det_labels)
        preds.append({"scores": torch.floor(rand(num_dets) * 12) / 12, "labels": det_labels,
                      "keypoints": torch.cat([det_points, rand(num_dets, keypoints, 1)], -1)})
        targets.append(target)
    return preds, targets


def pycocotools_keypoints(preds, targets, sigmas=None):
    """COCOeval(iouType="keypoints") on the same input: ground truth boxes xywh in float64 with
    their given area (else the box's), detections as keypoint results (loadRes boxes them)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    classes = sorted({int(v) for item in preds + targets for v in item["labels"]})
    images, annotations, results = [], [], []
    for image_id, (pred, target) in enumerate(zip(preds, targets), start=1):
        images.append({"id": image_id})
        for k in range(len(target["labels"])):
            x1, y1, x2, y2 = target["boxes"][k].double().tolist()
            given = float(target["area"][k]) if "area" in target else 0.0
            keypoints = target["keypoints"][k].double()
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": int(target["labels"][k]), "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "area": given if given > 0 else (x2 - x1) * (y2 - y1),
                                "iscrowd": int(target.get("iscrowd", [0] * (k + 1))[k]), "keypoints": keypoints.reshape(-1).tolist(),
                                "num_keypoints": int((keypoints[:, 2] > 0).sum())})
        for k in range(len(pred["labels"])):
            results.append({"image_id": image_id, "category_id": int(pred["labels"][k]),
                            "score": float(pred["scores"][k]),
                            "keypoints": pred["keypoints"][k].double().reshape(-1).tolist()})
    dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in classes]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), "keypoints")
        if sigmas is not None:
            evaluator.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def evaluate(preds, targets, backend, batch=16, **kwargs):
    metric = OnePassCocoMeanAveragePrecision(backend=backend, **{"iou_type": "keypoints"} | kwargs)
    for start in range(0, len(preds), batch):
        metric.update(preds[start : start + batch], targets[start : start + batch])
    return metric


def float64_arrays(metric):
    """The metric's accumulated precision and recall and its summary, before float32 rounding."""
    from detrkit.training.coco_backends.summary import summarize
    from detrkit.training.coco_map import _STATES, _numpy

    state = {name: _numpy(getattr(metric, name), _STATES[name][1]) for name in metric._defaults}
    inputs = metric._inputs(state, "keypoints", metric._classes(state))
    accumulation = metric._accumulate(inputs, metric.keypoint_grid)
    return accumulation, summarize(accumulation, metric.keypoint_grid, "keypoints")


@pytest.fixture(scope="module", params=[5, 17], ids=["5 keypoints", "17 keypoints"])
def state(request):
    preds, targets = keypoint_state(keypoints=request.param)
    sigmas = None if request.param == 17 else [0.05, 0.08, 0.03, 0.1, 0.06]
    return preds, targets, sigmas, pycocotools_keypoints(preds, targets, sigmas)


@pytest.mark.parametrize("backend", ALL)
def test_backend_equals_pycocotools_keypoints(backend, state):
    preds, targets, sigmas, reference = state
    metric = evaluate(preds, targets, backend, class_metrics=True, oks_sigmas=sigmas)
    accumulation, summary = float64_arrays(metric)
    assert np.abs(accumulation.precision - reference.eval["precision"]).max() <= 1e-12
    assert np.array_equal(accumulation.recall, reference.eval["recall"])
    assert np.abs(np.array([summary[key] for key in _KEYS]) - reference.stats).max() <= 1e-12
    result = metric.compute()
    assert [result[key].item() for key in _KEYS] == reference.stats.astype(np.float32).tolist()
    assert 0.05 < result["map"] < 0.95 and result["map_medium"] > 0 and result["map_large"] > 0  # a state that tests
    assert result["classes"].tolist() == [0, 1, 2, 3, 6]  # 2 and 3 predicted only
    assert result["map_per_class"][2:4].tolist() == [-1, -1]


def test_default_sigmas_are_coco_persons_for_17_keypoints_and_0_05_otherwise():
    preds, targets = keypoint_state(keypoints=4, images=12)
    expected = pycocotools_keypoints(preds, targets, [0.05] * 4).stats
    assert evaluate(preds, targets, "faster_coco_eval").compute()["map"].item() == np.float32(expected[0])
    from pycocotools.cocoeval import Params

    assert COCO_PERSON_SIGMAS == tuple(Params(iouType="keypoints").kpt_oks_sigmas.tolist())  # and 17 keypoints
    # use them: the 17-keypoint state above matches pycocotools without sigmas given


def _one(points, labels=(0,), scores=None, visibility=2.0, **extra):
    """One image: (N, K, 2) keypoint positions with a visibility (targets) or scores (preds)."""
    points = torch.as_tensor(points, dtype=torch.float64).reshape(len(labels), -1, 2)
    third = torch.full(points.shape[:2] + (1,), float(visibility), dtype=torch.float64)
    item = {"labels": torch.tensor(labels), "keypoints": torch.cat([points, third], -1)}
    if scores is not None:
        item["scores"] = torch.tensor(scores, dtype=torch.float64)
    return item | {key: torch.as_tensor(value, dtype=torch.float64) for key, value in extra.items()}


def test_one_detection_at_a_known_oks_is_a_true_positive_below_it_only():
    """OKS = exp(-d^2 / (2 area (2 sigma)^2)) for one labelled keypoint at distance d."""
    sigma, area, oks = 0.05, 5000.0, 0.73
    distance = math.sqrt(-math.log(oks) * 2 * area * (2 * sigma) ** 2)
    target = _one([[50.0, 50.0]], boxes=[[0.0, 0.0, 100.0, 100.0]], area=[area])
    pred = _one([[50.0 + distance, 50.0]], scores=[0.9], visibility=0.5)
    result = evaluate([pred], [target], "vernier", oks_sigmas=[sigma]).compute()
    assert result["map"].item() == pytest.approx(0.5)  # found at OKS 0.50 .. 0.70, missed from 0.75
    assert result["map_50"] == 1 and result["map_75"] == 0 and result["mar_20"].item() == pytest.approx(0.5)
    assert result["map_medium"].item() == pytest.approx(0.5) and result["map_large"] == -1  # 32^2 <= area < 96^2


@pytest.mark.parametrize("backend", ALL)
def test_crafted_cases_equal_pycocotools(backend):
    """A perfect match, a ground truth with no keypoint labelled (a detection on it is ignored,
    matched by box distance), a crowd, and a true match ranked 21st of 21 (past 20 per image)."""
    perfect = _one([[10.0, 10.0], [30.0, 40.0]], boxes=[[0.0, 0.0, 50.0, 50.0]], area=[2000.0])
    unlabelled = _one([[0.0, 0.0], [0.0, 0.0]], labels=(1,), boxes=[[100.0, 100.0, 200.0, 200.0]], visibility=0)
    crowd = _one([[0.0, 0.0], [0.0, 0.0]], labels=(0,), boxes=[[300.0, 0.0, 400.0, 100.0]], visibility=0, iscrowd=[1])
    targets = [perfect, unlabelled, crowd, _one([[60.0, 60.0], [70.0, 90.0]], boxes=[[50.0, 50.0, 90.0, 100.0]])]
    strays = torch.rand(20, 2, 2, generator=torch.Generator().manual_seed(0)).double() * 20 + 500
    preds = [_one([[10.0, 10.0], [30.0, 40.0]], scores=[0.5]),
             _one([[150.0, 150.0], [160.0, 170.0]], labels=(1,), scores=[0.8]),
             _one([[350.0, 50.0], [340.0, 60.0]], scores=[0.7]),
             _one(torch.cat([strays, torch.tensor([[[60.0, 60.0], [70.0, 90.0]]])]), labels=(0,) * 21,
                  scores=[0.9] * 20 + [0.1])]
    reference = pycocotools_keypoints(preds, targets, [0.05, 0.05])
    result = evaluate(preds, targets, backend, oks_sigmas=[0.05, 0.05]).compute()
    assert [result[key].item() for key in _KEYS] == reference.stats.astype(np.float32).tolist()
    assert result["mar_20"].item() == pytest.approx(0.5)  # class 0: the perfect one found, the 21st not


@pytest.mark.parametrize("backend", ALL)
def test_keypoints_beside_boxes_are_prefixed_and_change_no_box_number(backend):
    preds, targets = keypoint_state(images=12)
    for pred, target in zip(preds, targets):
        low, high = pred["keypoints"][..., :2].amin(1), pred["keypoints"][..., :2].amax(1)
        pred["boxes"] = torch.cat([low, high + 1], 1)
    both = evaluate(preds, targets, backend, class_metrics=True, iou_type=("bbox", "keypoints")).compute()
    boxes = OnePassCocoMeanAveragePrecision(backend=backend, class_metrics=True)
    boxes.update(preds, targets)
    keypoints = evaluate(preds, targets, backend, class_metrics=True).compute()
    assert {key for key in both if key != "classes"} == (
        {f"bbox_{key}" for key in boxes.compute() if key != "classes"}
        | {f"keypoints_{key}" for key in keypoints if key != "classes"})
    assert all(torch.equal(both[f"bbox_{key}"], value) for key, value in boxes.compute().items() if key != "classes")
    assert all(torch.equal(both[f"keypoints_{key}"], value) for key, value in keypoints.items() if key != "classes")
    assert set(_KEYS) | {"map_per_class", "mar_20_per_class", "classes"} == set(keypoints)


@pytest.mark.parametrize("backend", ALL)
def test_nothing_to_match_gives_pycocotools_zeros_and_minus_ones(backend):
    preds, targets = keypoint_state(images=6)
    empty = [{key: value[:0] for key, value in pred.items()} for pred in preds]
    result = evaluate(empty, targets, backend).compute()
    assert result["map"] == result["map_50"] == result["mar_20"] == 0  # ground truth to find, nothing found
    unfound = evaluate(preds, [{key: value[:0] for key, value in target.items()} for target in targets], backend)
    assert all(unfound.compute()[key] == -1 for key in _KEYS)


def test_errors_name_the_problem(monkeypatch):
    preds, targets = keypoint_state(images=3, keypoints=5)
    with pytest.raises(ValueError, match="5 keypoints per instance, but 3 OKS sigmas"):
        evaluate(preds, targets, "vernier", oks_sigmas=[0.1, 0.1, 0.1]).compute()
    metric = evaluate(preds, targets, "vernier")
    other, other_targets = keypoint_state(images=3, keypoints=4)
    with pytest.raises(ValueError, match="4 keypoints per instance, but 5"):
        metric.update(other[1:2], other_targets[1:2])
    with pytest.raises(ValueError, match=r"lacks \['keypoints'\]"):
        metric.update([{k: v for k, v in preds[1].items() if k != "keypoints"}], targets[1:2])
    with pytest.raises(ValueError, match=r"expected \(N, K, 3\)"):
        metric.update([preds[1] | {"keypoints": preds[1]["keypoints"][..., :2]}], targets[1:2])
    with pytest.raises(ValueError, match="positive finite"):
        OnePassCocoMeanAveragePrecision(iou_type="keypoints", oks_sigmas=[0.1, -1.0])
    with pytest.raises(ValueError, match="masks and keypoints"):
        OnePassCocoMeanAveragePrecision(iou_type=("bbox", "segm", "keypoints"))


def test_a_backend_without_keypoints_is_refused_naming_those_with_them(monkeypatch):
    boxes_only = type("BoxesOnly", (_BACKENDS["hotcoco"],), {"iou_types": ("bbox", "segm")})
    monkeypatch.setitem(_BACKENDS, "hotcoco", boxes_only)
    able = sorted(set(_BACKENDS) - {"hotcoco"})
    with pytest.raises(ValueError, match=re.escape(f"'hotcoco' cannot evaluate iou_type 'keypoints'; backends that can: {able}")):
        OnePassCocoMeanAveragePrecision(iou_type=("bbox", "keypoints"), backend="hotcoco")
    OnePassCocoMeanAveragePrecision(iou_type="bbox", backend="hotcoco")
