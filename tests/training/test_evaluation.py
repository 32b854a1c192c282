"""DetectionEvaluator: per-class AP under class names, and crowd regions from disk to the metric."""

from __future__ import annotations

import functools
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from detrkit.datasets.coco import CocoDetection
from detrkit.datasets.collate import collate
from detrkit.datasets.transforms import build_eval_transform, resize_batch
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.evaluation import DetectionEvaluator
from detrkit.training.module import _pixel_boxes

NAMES = ["cat", "dog", "bird", "fish", "frog"]  # "fish" (3) is only predicted, "frog" (4) never seen


def random_images(seed=0, images=30):
    """Detections near the ground truth plus stray ones; ground truth of classes 0..2 only."""
    generator = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for _ in range(images):
        gts = int(torch.randint(1, 6, (1,), generator=generator))
        corner = torch.rand(gts, 2, generator=generator) * 80
        gt_boxes = torch.cat([corner, corner + 4 + torch.rand(gts, 2, generator=generator) * 40], 1)
        gt_labels = torch.randint(0, 3, (gts,), generator=generator)
        noisy = gt_boxes + torch.randn(gts, 4, generator=generator) * 2
        stray = torch.rand(3, 4, generator=generator) * 60
        stray[:, 2:] += stray[:, :2] + 2
        boxes = torch.cat([noisy, stray])
        boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        labels = torch.cat([gt_labels, torch.tensor([0, 3, 1])])
        preds.append({"boxes": boxes, "scores": torch.rand(gts + 3, generator=generator), "labels": labels})
        targets.append({"boxes": gt_boxes, "labels": gt_labels})
    return preds, targets


def evaluate(preds, targets, **kwargs):
    evaluator = DetectionEvaluator(100, **kwargs)
    for start in range(0, len(preds), 8):
        evaluator.add(preds[start : start + 8], targets[start : start + 8])
    return evaluator.compute()


def test_per_class_ap_is_the_metrics_per_class_ap_under_the_class_names():
    preds, targets = random_images()
    result = evaluate(preds, targets, class_names=NAMES)
    metric = OnePassCocoMeanAveragePrecision(class_metrics=True, max_detection_thresholds=[1, 10, 100])
    metric.update(preds, targets)
    reference = metric.compute()
    assert reference["classes"].tolist() == [0, 1, 2, 3]
    per_class = reference["map_per_class"].tolist()
    assert per_class[3] == -1.0  # predicted only: no AP
    expected = {f"AP/{NAMES[label]}": per_class[label] for label in range(3)}
    assert {key: value for key, value in result.items() if key.startswith("AP/")} == expected
    assert all(0.0 < value < 1.0 for value in expected.values())
    # float32 results, as torchmetrics returns them: the mean of rounded values is within 1e-7
    assert result["mAP_50_95"] == pytest.approx(np.mean(list(expected.values())), abs=1e-7)
    assert result["mAP_50_95"] == reference["map"].item()


def test_a_class_with_ground_truth_that_is_never_found_reports_zero():
    target = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]]), "labels": torch.tensor([0, 2])}
    pred = {"boxes": torch.tensor([[0.0, 0, 10, 10]]), "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}
    result = evaluate([pred], [target], class_names=NAMES)
    assert {key: value for key, value in result.items() if key.startswith("AP/")} == {"AP/cat": 1.0, "AP/bird": 0.0}


def test_without_class_names_there_are_no_per_class_keys():
    preds, targets = random_images(images=4)
    result = evaluate(preds, targets)
    assert sorted(result) == ["F1", "mAP_50", "mAP_50_95", "mAP_75", "mAR", "precision", "recall"]


def test_a_ground_truth_label_without_a_name_is_an_error():
    preds, targets = random_images(images=4)
    with pytest.raises(ValueError, match="label 2 has no name"):
        evaluate(preds, targets, class_names=NAMES[:2])


# --- crowd regions, from the annotation file to the metric ----------------------------------


@pytest.fixture
def crowd_split(tmp_path):
    """A 200x100 image: a cat [20, 10, 60, 40] (xywh) and a crowd of cats [100, 20, 80, 70]."""
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (100, 200, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [20, 10, 60, 40], "area": 2400, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 1, "bbox": [100, 20, 80, 70], "area": 5000, "iscrowd": 1},
    ]
    data = {"images": [{"id": 1, "file_name": "a.png", "width": 200, "height": 100}], "annotations": annotations,
            "categories": [{"id": 1, "name": "cat", "supercategory": "animal"}]}
    (tmp_path / "valid.json").write_text(json.dumps(data))
    return CocoDetection(tmp_path / "valid.json", tmp_path, build_eval_transform(64))


def _truth(dataset):
    """Ground truth as validation hands it to the evaluator: collated, resized, in source pixels."""
    batch = resize_batch(functools.partial(collate, block=16)([dataset[0]]), 48)
    return [_pixel_boxes(target) for target in batch.targets]


def test_pixel_boxes_append_crowd_regions(crowd_split):
    truth = _truth(crowd_split)[0]
    torch.testing.assert_close(truth["boxes"], torch.tensor([[20.0, 10, 80, 50], [100, 20, 180, 90]]))
    assert truth["labels"].tolist() == [0, 0] and truth["iscrowd"].tolist() == [0, 1]
    assert truth["area"].tolist() == [2400.0, 0.0]  # 0: the metric takes the crowd's box area


def test_a_detection_on_a_crowd_region_changes_nothing(crowd_split):
    truth = _truth(crowd_split)
    hit = {"boxes": torch.tensor([[25.0, 10, 80, 50]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([0])}
    crowd_box = {"boxes": torch.tensor([[110.0, 30, 150, 70]]), "scores": torch.tensor([0.9]),
                 "labels": torch.tensor([0])}
    on_crowd = {key: torch.cat([crowd_box[key], hit[key]]) for key in hit}  # the crowd's detection ranks first
    alone, with_crowd_hit = evaluate([hit], truth), evaluate([on_crowd], truth)
    assert alone["mAP_50_95"] == pytest.approx(0.9)  # IoU 55/60: found at thresholds 0.5 to 0.9
    for key in ("mAP_50_95", "mAP_50", "mAP_75", "mAR"):
        assert with_crowd_hit[key] == alone[key], key
    # without the crowd region the detection on it is a false positive ranked first
    crowdless = [{key: value[:1] for key, value in item.items()} for item in truth]
    assert evaluate([on_crowd], crowdless)["mAP_50_95"] < alone["mAP_50_95"]


def test_targets_without_crowd_fields_still_evaluate(crowd_split):
    target = replace(crowd_split[0][1], crowd_boxes=None, crowd_labels=None, area=None)
    truth = _pixel_boxes(target)
    assert truth["iscrowd"].tolist() == [0] and truth["area"].tolist() == [0.0]
