"""DetectionEvaluator on keypoint runs: OKS keypoint AP/AR under spec 14's names, beside the box metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_coco_map_keypoints import keypoint_state, pycocotools_keypoints
from tiny_config import TINY

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.models.postprocess import top_keypoint_detections
from detrkit.structures import Target
from detrkit.training.checkpoints import metric_key
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.evaluation import KEYPOINT_METRICS, DetectionEvaluator, with_keypoints
from detrkit.training.module import _pixel_boxes


def boxed_state(**kwargs):
    """keypoint_state with detection boxes around each detection's keypoints."""
    preds, targets = keypoint_state(**kwargs)
    for pred in preds:
        low, high = pred["keypoints"][..., :2].amin(1), pred["keypoints"][..., :2].amax(1)
        pred["boxes"] = torch.cat([low, high + 2], 1)
    return preds, targets


def evaluate(preds, targets, **kwargs):
    evaluator = DetectionEvaluator(100, **kwargs)
    for start in range(0, len(preds), 8):
        evaluator.add(preds[start : start + 8], targets[start : start + 8])
    return evaluator.compute(), evaluator.coco_stats


def test_keypoint_runs_add_oks_ap_and_ar_under_the_spec_names_and_keep_the_box_numbers():
    preds, targets = boxed_state(keypoints=4)
    sigmas = [0.04, 0.06, 0.05, 0.09]
    values, stats = evaluate(preds, targets, keypoints=True, keypoint_sigmas=sigmas)
    boxes_only, box_stats = evaluate(preds, targets)
    assert set(values) - set(boxes_only) == {"keypoint_map_50_95", "keypoint_map_50", "keypoint_map_75",
                                             "keypoint_mAR"}
    assert {key: values[key] for key in boxes_only} == boxes_only and stats == box_stats
    expected = pycocotools_keypoints(preds, targets, sigmas).stats  # AP, AP50, AP75, ..., AR (5th)
    assert [values[name] for name in KEYPOINT_METRICS] == [float(np.float32(expected[i])) for i in (0, 1, 2, 5)]
    assert 0.05 < values["keypoint_map_50_95"] < values["keypoint_map_50"] < 1


def test_unavailable_keypoint_numbers_are_not_reported():
    preds, targets = boxed_state(images=4, keypoints=3)
    for target in targets:
        target["keypoints"][..., 2] = 0  # no keypoint labelled: COCOeval ignores every instance
    values, _ = evaluate(preds, targets, keypoints=True)
    assert not set(KEYPOINT_METRICS) & set(values) and "mAP_50_95" in values


def test_masks_and_keypoints_are_not_evaluated_together():
    with pytest.raises(ValueError, match="masks or keypoints"):
        DetectionEvaluator(100, masks=True, keypoints=True)


def test_with_keypoints_scales_to_source_pixels_and_gives_crowds_none():
    keypoints = torch.tensor([[[0.5, 0.25, 2.0], [0.1, 0.9, 1.0], [0.0, 0.0, 0.0]]])
    target = Target(boxes=torch.tensor([[0.5, 0.5, 0.5, 0.5]]), labels=torch.tensor([0]), image_id=1,
                    orig_size=(200, 400), size=(64, 128), area=torch.tensor([5000.0]),
                    crowd_boxes=torch.tensor([[0.0, 0.0, 40.0, 40.0]]), crowd_labels=torch.tensor([0]),
                    keypoints=keypoints)
    truth = [_pixel_boxes(target)]
    with_keypoints(truth, [target])
    assert truth[0]["keypoints"].tolist() == [[[200.0, 50.0, 2.0], [40.0, 180.0, 1.0], [0.0, 0.0, 0.0]],
                                              [[0.0, 0.0, 0.0]] * 3]
    pred = {"boxes": torch.tensor([[100.0, 50.0, 300.0, 150.0], [0.0, 0.0, 40.0, 40.0]]),
            "scores": torch.tensor([0.8, 0.95]), "labels": torch.tensor([0, 0]),
            "keypoints": torch.tensor([[[200.0, 50.0, 0.9], [40.0, 180.0, 0.9], [7.0, 7.0, 0.1]],
                                       [[10.0, 10.0, 0.5], [20.0, 20.0, 0.5], [30.0, 30.0, 0.5]]])}
    metric = OnePassCocoMeanAveragePrecision(iou_type="keypoints")
    metric.update([pred], truth)
    result = metric.compute()
    assert result["map"] == 1 and result["mar_20"] == 1  # the better-scored one on the crowd region is ignored


def test_metric_key_ranks_keypoint_runs_by_keypoint_ap_or_ar():
    assert metric_key("map", keypoints=True) == "keypoint_map_50_95"
    assert metric_key("mar", keypoints=True) == "keypoint_mAR"
    assert metric_key("map", segmentation=True) == "segm_mAP_50_95"
    assert metric_key("mar", segmentation=True) == "mAR"
    assert metric_key("map") == "mAP_50_95" and metric_key("mar") == "mAR"


def test_a_keypoint_models_outputs_reach_the_keypoint_metrics():
    """The validation path: postprocessed keypoint detections of a tiny keypoint model, scored
    against ground truth whose keypoints are the model's own (so some are found)."""
    torch.manual_seed(0)
    config = ModelConfig(**TINY, use_grouppose_keypoints=True, dual_projector=True, dual_projector_kp_only=True,
                         num_keypoints_per_class=[3])
    outputs = build_model(config).eval()(torch.randn(2, 3, 64, 64))
    sizes = torch.tensor([[64, 64], [48, 80]])
    detections = top_keypoint_detections(outputs.pred_logits, outputs.pred_boxes, outputs.pred_keypoints, sizes,
                                         config.num_select, config.num_keypoints_per_class,
                                         config.postprocess_trace_alpha)
    assert detections[0]["keypoints"].shape == (12, 3, 3) and detections[0]["scores"].shape == (12,)
    targets = []
    for detection, (height, width) in zip(detections, sizes.tolist()):
        chosen = (detection["labels"] == 0).nonzero()[:2, 0]  # the keypoint class's best two
        first = detection["boxes"][chosen]
        keypoints = detection["keypoints"][chosen].clone()
        keypoints[..., :2] /= torch.tensor([width, height])
        keypoints[..., 2] = 2.0
        centre = torch.cat([(first[:, :2] + first[:, 2:]) / 2, (first[:, 2:] - first[:, :2]).clamp(min=1)], 1)
        targets.append(Target(boxes=centre / torch.tensor([width, height] * 2), labels=torch.zeros_like(chosen),
                              image_id=1, orig_size=(height, width), size=(64, 64), keypoints=keypoints))
    truth = [_pixel_boxes(target) for target in targets]
    with_keypoints(truth, targets)
    evaluator = DetectionEvaluator(100, keypoints=True)
    evaluator.add(detections, truth)
    values = evaluator.compute()
    assert set(KEYPOINT_METRICS) <= set(values) and values["keypoint_mAR"] == 1  # each found at OKS 1
