"""OnePassCocoMeanAveragePrecision: every backend returns the same numbers, and they are pycocotools'."""

from __future__ import annotations

import builtins
import contextlib
import copy
import importlib.util
import io
from typing import get_args

import numpy as np
import pytest
import torch

from detrkit.config import CocoEvalBackend
from detrkit.training.coco_backends.rle import decode_runs, encode_masks, mask_areas, split_runs
from detrkit.training.coco_map import _BACKENDS, OnePassCocoMeanAveragePrecision

# registry name -> the module it imports, read from the registry: every test below that takes
# ALL, ALTERNATIVES or MASKS covers a newly registered backend without a change here
_BACKEND_PACKAGES = {name: backend.package for name, backend in _BACKENDS.items()}
_BASELINE = "faster_coco_eval"
_ALTERNATIVE_BACKENDS = sorted(set(_BACKEND_PACKAGES) - {_BASELINE})
_MASK_BACKENDS = sorted(name for name, backend in _BACKENDS.items() if not backend.requires_bbox)
_SUMMARY_KEYS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10")
_AREAS = ("small", "medium", "large")


def _installed(name: str) -> object:
    missing = importlib.util.find_spec(_BACKEND_PACKAGES[name]) is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=f"{_BACKEND_PACKAGES[name]} not installed"))


ALL = [_installed(name) for name in sorted(_BACKEND_PACKAGES)]
ALTERNATIVES = [_installed(name) for name in _ALTERNATIVE_BACKENDS]
MASKS = [_installed(name) for name in _MASK_BACKENDS]


def random_state(seed=0, images=60, classes=5, dets=30, gts=8, size=(48, 80), masks=False, tie_levels=16):
    """Images with crowds, score ties, images without detections (every 7th) or ground truth
    (every 11th), near-miss detections, given areas on odd images, classes seen on one side and,
    with `masks`, mask canvases of two sizes."""
    generator = torch.Generator().manual_seed(seed)
    height, width = size

    def rand(*shape):
        return torch.rand(*shape, generator=generator)

    def boxes(count):
        corner = rand(count, 2) * torch.tensor([width * 0.8, height * 0.8])
        return torch.cat([corner, corner + rand(count, 2) * torch.tensor([width / 2, height / 2]) + 0.5], 1)

    preds, targets = [], []
    for index in range(images):
        num_dets = int(torch.randint(0, dets + 1, (1,), generator=generator)) if index % 7 else 0
        num_gts = int(torch.randint(0, gts + 1, (1,), generator=generator)) if index % 11 else 0
        gt_boxes = boxes(num_gts)
        gt_labels = torch.randint(0, classes, (num_gts,), generator=generator)
        near = min(num_dets // 2, num_gts)
        det_boxes = torch.cat([gt_boxes[:near] + torch.randn(near, 4, generator=generator) * 1.5, boxes(num_dets - near)])
        det_boxes[:, 2:] = torch.maximum(det_boxes[:, 2:], det_boxes[:, :2] + 0.25)
        det_labels = torch.cat([gt_labels[:near], torch.randint(0, classes + 1, (num_dets - near,), generator=generator)])
        pred = {"boxes": det_boxes, "labels": det_labels, "scores": torch.floor(rand(num_dets) * tie_levels) / tie_levels}
        target = {"boxes": gt_boxes, "labels": gt_labels + (gt_labels == 2).long() * 4,  # class 6: ground truth only
                  "iscrowd": (rand(num_gts) < 0.15).long()}
        if index % 2:
            target["area"] = (gt_boxes[:, 2:] - gt_boxes[:, :2]).prod(1) * (0.2 + 2 * rand(num_gts))
        if masks:  # every third image on a canvas of another size
            canvas = (height, width) if index % 3 else (height + 8, width - 16)
            target["masks"] = _box_masks(gt_boxes, *canvas, rand)
            pred["masks"] = _box_masks(det_boxes, *canvas, rand)
            pred["masks"][:near] = target["masks"][:near] ^ (rand(near, *canvas) < 0.1)
        preds.append(pred)
        targets.append(target)
    return preds, targets


def _box_masks(boxes, height, width, rand):
    ys = torch.arange(height).view(1, height, 1) + 0.5
    xs = torch.arange(width).view(1, 1, width) + 0.5
    columns = (xs >= boxes[:, 0, None, None]) & (xs <= boxes[:, 2, None, None])
    inside = columns & (ys >= boxes[:, 1, None, None]) & (ys <= boxes[:, 3, None, None])  # (N, H, W)
    return inside & (rand(len(boxes), height, width) < 0.9)


def coco_like_state(images=300, dets=100, gts=20, classes=80, seed=0):
    """float32 boxes over a 640 x 480 image in all three area ranges, as a detector would emit."""
    generator = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for _ in range(images):
        corner = torch.rand(gts, 2, generator=generator) * torch.tensor([600.0, 440.0])
        gt_boxes = torch.cat([corner, corner + 2 + torch.rand(gts, 2, generator=generator) ** 2 * 200], 1)
        gt_labels = torch.randint(0, classes, (gts,), generator=generator)
        index = torch.randint(0, gts, (dets,), generator=generator)
        det_boxes = gt_boxes[index] + torch.randn(dets, 4, generator=generator) * (gt_boxes[index, 2:] - gt_boxes[index, :2]).repeat(1, 2) * 0.1
        det_boxes[:, 2:] = torch.maximum(det_boxes[:, 2:], det_boxes[:, :2] + 1)
        relabel = torch.rand(dets, generator=generator) < 0.3
        det_labels = torch.where(relabel, torch.randint(0, classes, (dets,), generator=generator), gt_labels[index])
        preds.append({"boxes": det_boxes, "scores": torch.rand(dets, generator=generator), "labels": det_labels})
        targets.append({"boxes": gt_boxes, "labels": gt_labels, "iscrowd": torch.zeros(gts, dtype=torch.long)})
    return preds, targets


def pycocotools_reference(preds, targets, iou_type="bbox", max_dets=(1, 10, 100), mask_area=None):
    """pycocotools' COCOeval on the same input: xyxy -> xywh in float64, detections in order;
    ground truth without a given area gets its mask's (`mask_area`, default for segm) or box's."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(box):
        x1, y1, x2, y2 = box.double().tolist()
        return [x1, y1, x2 - x1, y2 - y1]

    def rle(mask):
        return mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))

    mask_area = iou_type == "segm" if mask_area is None else mask_area
    classes = sorted({int(v) for item in preds + targets for v in item["labels"]})
    images, annotations, results = [], [], []
    for image_id, (pred, target) in enumerate(zip(preds, targets), start=1):
        height, width = target["masks"].shape[-2:] if iou_type == "segm" else (0, 0)
        images.append({"id": image_id, "height": int(height), "width": int(width)})
        for k in range(len(target["labels"])):
            annotation = {"id": len(annotations) + 1, "image_id": image_id, "category_id": int(target["labels"][k]),
                          "bbox": xywh(target["boxes"][k]), "iscrowd": int(target["iscrowd"][k]) if "iscrowd" in target else 0}
            if iou_type == "segm":
                annotation["segmentation"] = rle(target["masks"][k])
            if mask_area:
                fallback = float(mask_utils.area(rle(target["masks"][k])))
            else:
                fallback = annotation["bbox"][2] * annotation["bbox"][3]
            given = float(target["area"][k]) if "area" in target else 0.0
            annotation["area"] = given if given > 0 else fallback
            annotations.append(annotation)
        for k in range(len(pred["labels"])):
            result = {"image_id": image_id, "category_id": int(pred["labels"][k]), "score": float(pred["scores"][k])}
            if iou_type == "segm":
                result["segmentation"] = rle(pred["masks"][k])
            else:
                result["bbox"] = xywh(pred["boxes"][k])
            results.append(result)
    dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in classes]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        if results:
            dt = gt.loadRes(results)
        else:  # loadRes cannot take an empty list
            dt = COCO()
            dt.dataset = {**dataset, "annotations": []}
            dt.createIndex()
        evaluator = COCOeval(gt, dt, iou_type)
        evaluator.params.maxDets = list(max_dets)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    last = max_dets[-1]

    def summarize(ap, iou=None, area="all", limit=last):
        """COCOeval.summarize's _summarize, which pycocotools keeps local to summarize()."""
        values = evaluator.eval["precision" if ap else "recall"]
        if iou is not None:
            values = values[np.where(iou == evaluator.params.iouThrs)[0]]
        area_index, limit_index = evaluator.params.areaRngLbl.index(area), evaluator.params.maxDets.index(limit)
        values = values[..., area_index, limit_index]
        return float(np.mean(values[values > -1])) if (values > -1).any() else -1.0

    expected = {"map": summarize(1), "map_50": summarize(1, iou=0.5), "map_75": summarize(1, iou=0.75)}
    expected |= {f"map_{area}": summarize(1, area=area) for area in _AREAS}
    expected |= {f"mar_{limit}": summarize(0, limit=limit) for limit in max_dets}
    expected |= {f"mar_{area}": summarize(0, area=area) for area in _AREAS}
    if max_dets == (1, 10, 100):  # where summarize()'s own stats are read where we read them
        assert list(expected.values()) == evaluator.stats.tolist()
    precision, recall = evaluator.eval["precision"], evaluator.eval["recall"]

    def mean(values):
        return float(np.mean(values[values > -1])) if (values > -1).any() else -1.0

    expected["map_per_class"] = [mean(precision[:, :, k, 0, -1]) for k in range(len(classes))]
    expected[f"mar_{last}_per_class"] = [mean(recall[:, k, 0, -1]) for k in range(len(classes))]
    return expected


def evaluate(preds, targets, backend, batch=16, **kwargs):
    metric = OnePassCocoMeanAveragePrecision(backend=backend, **kwargs)
    for start in range(0, len(preds), batch):
        metric.update(preds[start : start + batch], targets[start : start + batch])
    return metric.compute()


def assert_identical(result, baseline):
    assert result.keys() == baseline.keys()
    for key in baseline:
        assert result[key].dtype == baseline[key].dtype, key
        assert torch.equal(result[key], baseline[key]), (key, result[key], baseline[key])


def max_difference(result, expected, prefix=""):
    """Largest |result - pycocotools rounded to float32| over every aggregate and per-class
    value: 0 when ours are pycocotools' numbers in torchmetrics' float32."""
    worst = 0.0
    for key, value in expected.items():
        assert result[prefix + key].dtype == torch.float32, key
        ours = result[prefix + key].numpy().reshape(-1).astype(np.float64)  # torchmetrics squeezes one-element results
        assert ours.size == np.size(value), key
        theirs = np.reshape(value, -1).astype(np.float32).astype(np.float64)
        worst = max(worst, float(np.max(np.abs(ours - theirs), initial=0.0)))
    return worst


# --- the registry ---------------------------------------------------------------------------


def test_backend_registry_matches_the_typed_eval_backend_names():
    assert set(_BACKENDS) == set(get_args(CocoEvalBackend))
    assert _BASELINE in _BACKENDS


def test_missing_backend_package_names_the_train_extra(monkeypatch):
    real_import = builtins.__import__

    def without_hotcoco(name, *args, **kwargs):
        if name.split(".")[0] == "hotcoco":
            raise ModuleNotFoundError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "hotcoco", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_hotcoco)
    with pytest.raises(ImportError, match=r"detrkit\[train\]"):
        OnePassCocoMeanAveragePrecision(backend="hotcoco")


def test_vernier_rejects_mask_only_evaluation_at_construction():
    with pytest.raises(ValueError, match="bbox"):
        OnePassCocoMeanAveragePrecision(backend="vernier", iou_type="segm")
    OnePassCocoMeanAveragePrecision(backend="vernier", iou_type=("bbox", "segm"))


@pytest.mark.parametrize("kwargs", [{"backend": "pycocotools"}, {"iou_type": ("segm", "keypoints")},
                                    {"max_detection_thresholds": [1, 10]}, {"extended_summary": True},
                                    {"box_format": "yxyx"}, {"iou_thresholds": [1.5]}, {"average": "micro"},
                                    {"sync_on_compute": True}, {"dist_sync_on_step": True}, {"num_classes": 0}])
def test_invalid_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        OnePassCocoMeanAveragePrecision(**kwargs)


# --- parity: every backend equals faster-coco-eval exactly -----------------------------------


@pytest.fixture(scope="module")
def box_state():
    return random_state(seed=1)


@pytest.fixture(scope="module")
def mask_state():
    return random_state(seed=2, images=40, masks=True)


@pytest.mark.parametrize("backend", ALTERNATIVES)
def test_alternative_backend_matches_faster_coco_eval(backend, box_state):
    baseline = evaluate(*box_state, _BASELINE, class_metrics=True)
    assert_identical(evaluate(*box_state, backend, class_metrics=True), baseline)


@pytest.mark.parametrize("backend", ALTERNATIVES)
def test_alternative_backend_matches_faster_coco_eval_for_segmentation(backend, mask_state):
    kwargs = {"class_metrics": True, "iou_type": ("bbox", "segm")}
    baseline = evaluate(*mask_state, _BASELINE, **kwargs)
    assert "segm_map" in baseline and "bbox_map" in baseline
    assert_identical(evaluate(*mask_state, backend, **kwargs), baseline)


# --- pycocotools is the oracle ---------------------------------------------------------------


@pytest.fixture(scope="module")
def coco_like():
    preds, targets = coco_like_state()
    return preds, targets, pycocotools_reference(preds, targets, max_dets=(1, 10, 500))


@pytest.mark.parametrize("backend", ALL)
def test_backend_equals_pycocotools_on_a_300_image_state(backend, coco_like):
    preds, targets, expected = coco_like
    result = evaluate(preds, targets, backend, batch=32, class_metrics=True, max_detection_thresholds=[1, 10, 500])
    assert max_difference(result, expected) == 0.0
    assert 0.1 < result["map"] < 0.9 and result["map_small"] > 0 and result["map_large"] > 0  # a state that tests


@pytest.mark.parametrize("max_dets", [(1, 10, 100), (1, 2, 3)])
@pytest.mark.parametrize("backend", ALL)
def test_backend_equals_pycocotools_with_crowds_ties_and_empty_images(backend, box_state, max_dets):
    expected = pycocotools_reference(*box_state, max_dets=max_dets)
    result = evaluate(*box_state, backend, class_metrics=True, max_detection_thresholds=list(max_dets))
    assert max_difference(result, expected) == 0.0


@pytest.mark.parametrize("backend", ALL)
def test_backend_equals_pycocotools_for_masks(backend, mask_state):
    result = evaluate(*mask_state, backend, class_metrics=True, iou_type=("bbox", "segm"))
    for iou_type in ("bbox", "segm"):  # both passes bucket sizes by mask area
        expected = pycocotools_reference(*mask_state, iou_type=iou_type, mask_area=True)
        assert max_difference(result, expected, prefix=f"{iou_type}_") == 0.0
    assert result["segm_map"] != result["bbox_map"]


@pytest.mark.parametrize("backend", MASKS)
def test_mask_only_evaluation_needs_no_boxes(backend, mask_state):
    preds, targets = mask_state
    preds = [{key: value for key, value in pred.items() if key != "boxes"} for pred in preds]
    targets = [{key: value for key, value in target.items() if key != "boxes"} for target in targets]
    result = evaluate(preds, targets, backend, class_metrics=True, iou_type="segm")
    assert max_difference(result, pycocotools_reference(*mask_state, iou_type="segm")) == 0.0


# --- semantics on hand-made images -----------------------------------------------------------


def _image(boxes, labels, scores=None, **extra):
    item = {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor(labels, dtype=torch.int64)}
    if scores is not None:
        item["scores"] = torch.tensor(scores)
    return item | {key: torch.as_tensor(value) for key, value in extra.items()}


@pytest.mark.parametrize("backend", ALL)
def test_detections_on_a_crowd_region_are_ignored(backend):
    target = _image([[0, 0, 10, 10], [20, 20, 60, 60]], [1, 1], iscrowd=[0, 1])
    pred = _image([[0, 0, 10, 10], [25, 25, 35, 35], [30, 30, 40, 40]], [1, 1, 1], [0.5, 0.9, 0.8])
    result = evaluate([pred], [target], backend)
    assert result["map"].item() == 1.0 and result["mar_1"].item() == 0.0  # the top detection is ignored, not false
    crowdless = evaluate([pred], [target | {"iscrowd": torch.tensor([0, 0])}], backend)
    assert crowdless["map"] < 1.0


@pytest.mark.parametrize("backend", ALL)
def test_crowd_regions_equal_pycocotools(backend):
    """A crowd absorbs any number of detections of its class that lie inside it (intersection
    over the detection's area), never one of another class; a real box inside a crowd is found
    first; crowds with odd given areas and an image whose only ground truth is a crowd."""
    crowd, inside, person = [0, 0, 100, 100], [10, 10, 30, 30], [60, 60, 90, 90]
    target = _image([crowd, inside, person, [150, 150, 160, 160]], [1, 1, 2, 1], iscrowd=[1, 0, 0, 1],
                    area=[5.0, 0, 0, 1e6])
    pred = _image([[12, 12, 28, 28], [10, 10, 30, 30], [40, 40, 55, 55], [5, 80, 20, 95], [60, 60, 90, 90],
                   [62, 62, 88, 88], [90, 90, 140, 140], [151, 151, 159, 159], [152, 150, 160, 160]],
                  [1, 1, 1, 1, 2, 1, 1, 1, 2], [0.95, 0.6, 0.9, 0.9, 0.7, 0.85, 0.8, 0.75, 0.99])
    second_target = _image([[0, 0, 40, 40]], [2], iscrowd=[1])  # an image whose only ground truth is a crowd
    second_pred = _image([[5, 5, 20, 20], [0, 0, 40, 40]], [2, 1], [0.9, 0.8])
    preds, targets = [pred, second_pred], [target, second_target]
    result = evaluate(preds, targets, backend, class_metrics=True)
    assert max_difference(result, pycocotools_reference(preds, targets)) == 0.0
    assert 0.0 < result["map"].item() < 1.0 and result["map_small"].item() != -1.0


@pytest.mark.parametrize("backend", ALL)
def test_boxes_become_xywh_in_float64(backend):
    # float32 32.3 - 0.3 rounds to exactly 32: an area of 1024, both small and medium to COCO;
    # in float64 the width is 31.99999923 and the box is small only (32.7: medium only)
    boxes = [[0.3, 0, 32.3, 32], [100.7, 0, 132.7, 32]]
    pred, target = _image(boxes, [1, 2], [0.9, 0.9]), _image(boxes, [1, 2])
    result = evaluate([pred], [target], backend, class_metrics=True)
    assert max_difference(result, pycocotools_reference([pred], [target])) == 0.0
    assert result["map_small"].item() == 1.0 and result["map_medium"].item() == 1.0
    small = evaluate([_image(boxes[:1], [1], [0.9])], [_image(boxes[:1], [1])], backend)
    assert small["map_medium"].item() == -1.0


@pytest.mark.parametrize("backend", ALL)
def test_score_ties_keep_the_given_order(backend):
    target = _image([[0, 0, 10, 10]], [0])
    hit, miss = [0, 0, 10, 10], [50, 50, 60, 60]
    first = evaluate([_image([hit, miss], [0, 0], [0.5, 0.5])], [target], backend)
    second = evaluate([_image([miss, hit], [0, 0], [0.5, 0.5])], [target], backend)
    assert first["map"].item() == 1.0 and second["map"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("backend", ALL)
def test_classes_seen_on_one_side_only(backend):
    target = _image([[0, 0, 10, 10], [20, 20, 30, 30]], [3, 7])
    pred = _image([[0, 0, 10, 10], [40, 40, 50, 50]], [3, 5], [0.9, 0.8])
    result = evaluate([pred, _image([], [], [])], [target, _image([], [])], backend, class_metrics=True)
    assert result["classes"].tolist() == [3, 5, 7] and result["classes"].dtype == torch.int32
    assert result["map_per_class"].tolist() == [1.0, -1.0, 0.0]  # no ground truth: -1; never found: 0
    assert result["mar_100_per_class"].tolist() == [1.0, -1.0, 0.0]
    assert result["map"].item() == 0.5


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("side", ["preds", "targets", "both"])
def test_nothing_to_match(backend, side):
    full_pred, full_target = _image([[0, 0, 10, 10]], [1], [0.9]), _image([[0, 0, 10, 10]], [2])
    empty_pred, empty_target = _image([], [], []), _image([], [])
    pred = empty_pred if side in ("preds", "both") else full_pred
    target = empty_target if side in ("targets", "both") else full_target
    result = evaluate([pred, empty_pred], [target, empty_target], backend, class_metrics=True)
    expected = pycocotools_reference([pred, empty_pred], [target, empty_target])
    assert max_difference(result, expected) == 0.0
    assert result["map"].item() == (0.0 if side == "preds" else -1.0)


@pytest.mark.parametrize("box_format", ["xywh", "cxcywh"])
def test_box_formats_convert_to_the_same_boxes(box_state, box_format):
    preds, targets = box_state

    def convert(item):
        x1, y1, x2, y2 = item["boxes"].double().unbind(1)
        if box_format == "xywh":
            boxes = torch.stack([x1, y1, x2 - x1, y2 - y1], 1)
        else:
            boxes = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1)
        return item | {"boxes": boxes}

    converted = evaluate([convert(p) for p in preds], [convert(t) for t in targets], "vernier", box_format=box_format)
    reference = evaluate(preds, targets, "vernier")
    for key in _SUMMARY_KEYS:
        assert converted[key].item() == pytest.approx(reference[key].item(), abs=1e-9)


def test_keys_are_torchmetrics_keys(box_state):
    from torchmetrics.detection import MeanAveragePrecision

    for kwargs in ({"class_metrics": True, "max_detection_thresholds": [1, 5, 50]}, {"iou_type": ("bbox", "segm")}):
        reference = MeanAveragePrecision(**kwargs)
        ours = OnePassCocoMeanAveragePrecision(**kwargs)
        for metric in (reference, ours):
            pred = _image([[0, 0, 10, 10]], [1], [0.9], masks=torch.ones(1, 12, 12, dtype=torch.bool))
            target = _image([[0, 0, 10, 10]], [1], masks=torch.ones(1, 12, 12, dtype=torch.bool))
            metric.update([pred], [target])
        with contextlib.redirect_stdout(io.StringIO()):
            ours_result, reference_result = ours.compute(), reference.compute()
        assert list(ours_result) == list(reference_result)
        # float32 everywhere, `classes` int32, as torchmetrics returns them
        assert {key: value.dtype for key, value in ours_result.items()} == {
            key: value.dtype for key, value in reference_result.items()}
        assert {value.dtype for key, value in ours_result.items() if key != "classes"} == {torch.float32}
    sentinels = evaluate(*box_state, "vernier")
    assert sentinels["map_per_class"].item() == -1.0 and sentinels["mar_100_per_class"].item() == -1.0


def test_synced_copied_and_reset_states_give_the_same_numbers(box_state):
    preds, targets = box_state
    metric = OnePassCocoMeanAveragePrecision(class_metrics=True)
    for start in range(0, len(preds), 16):
        metric.update(preds[start : start + 16], targets[start : start + 16])
    reference = metric.compute()
    clone = copy.deepcopy(metric)
    # as torchmetrics gathers two ranks, the second without images (it contributes float32 empties)
    clone.sync(dist_sync_fn=lambda tensor, group=None: [tensor, torch.tensor([])], distributed_available=lambda: True)
    assert all(isinstance(getattr(clone, name), torch.Tensor) for name in clone._defaults)
    assert_identical(OnePassCocoMeanAveragePrecision.compute(clone), reference)
    metric.reset()
    metric.update(preds, targets)
    assert_identical(metric.compute(), reference)


def test_compute_before_any_update():
    with pytest.warns(UserWarning, match="compute"):
        result = OnePassCocoMeanAveragePrecision(iou_type=("bbox", "segm"), class_metrics=True).compute()
    assert result["bbox_map"].item() == -1.0 and result["segm_mar_100"].item() == -1.0
    assert result["classes"].numel() == 0 and result["segm_map_per_class"].numel() == 0


def test_update_checks_shapes():
    metric = OnePassCocoMeanAveragePrecision()
    with pytest.raises(ValueError, match="lacks"):
        metric.update([{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0)}], [_image([], [])])
    with pytest.raises(ValueError, match="boxes of shape"):
        metric.update([_image([[0, 0, 1, 1]], [1, 2], [0.5, 0.5])], [_image([], [])])
    valid, two_scores = _image([[0, 0, 1, 1]], [1], [0.5]), _image([[0, 0, 1, 1]], [1], [0.5, 0.4])
    with pytest.raises(ValueError, match="scores of shape"):  # the second image: the first is not kept
        metric.update([valid, two_scores], [_image([], []), _image([], [])])
    with pytest.raises(ValueError, match="targets"):
        metric.update([_image([], [], [])], [])
    assert metric.det_labels == [] and metric.gt_labels == []  # a refused batch stores nothing
    masks = OnePassCocoMeanAveragePrecision(iou_type=("bbox", "segm"))
    with pytest.raises(ValueError, match="resize"):
        masks.update([_image([], [], [], masks=torch.zeros(0, 4, 4))], [_image([], [], masks=torch.zeros(0, 5, 4))])


# --- mask run-length encoding ------------------------------------------------------------------


def _naive_runs(mask):
    """COCO's uncompressed RLE, one pixel at a time in column-major order."""
    runs, current, length = [], False, 0
    for pixel in mask.T.reshape(-1).tolist():
        if pixel != current:
            runs.append(length)
            current, length = pixel, 0
        length += 1
    return runs + [length]


def test_mask_runs_match_a_pixel_loop_and_pycocotools():
    from pycocotools import mask as mask_utils

    generator = torch.Generator().manual_seed(0)
    masks = torch.rand(40, 7, 9, generator=generator) < 0.5
    masks[0], masks[1], masks[2] = True, False, False
    masks[2, 0, 0] = True
    runs, lengths = encode_masks(masks)
    per_mask = split_runs(runs.numpy(), lengths.numpy())
    np.testing.assert_array_equal(mask_areas(runs.numpy(), lengths.numpy()), masks.sum((1, 2)).numpy())
    for mask, counts in zip(masks, per_mask):
        assert counts.tolist() == _naive_runs(mask.numpy())
        assert np.array_equal(decode_runs(counts, 7, 9), mask.numpy())
        ours = mask_utils.frPyObjects({"counts": counts.tolist(), "size": [7, 9]}, 7, 9)
        assert ours["counts"] == mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))["counts"]
    empty_runs, empty_lengths = encode_masks(torch.zeros(0, 3, 3, dtype=torch.bool))
    assert empty_runs.numel() == 0 and empty_lengths.numel() == 0
