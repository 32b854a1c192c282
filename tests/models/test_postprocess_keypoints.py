"""Keypoint postprocess (spec 10.1 step 4): against a per-detection twin and rfdetr 1.11.2's PostProcess.

tests/data/keypoint_postprocess_reference.pt was written by a side script run in the reference's
own environment (never part of detrkit): its PostProcess(num_select, num_keypoints_per_class,
trace_alpha) on seeded float32 outputs (score ties, l21 = 0, log-precisions of ±40, findable
logits of -60) for three cases: COCO person ([17], α 0.2, a non-keypoint label among the
selected), three classes ([3, 5, 0], α 0.5: padded slots, a class without keypoints, labels past
the keypoint classes) and no fusion ([4], α 0). Labels, boxes, keypoints and precision parameters
are bit-identical; 3 of the 60 fused person scores are one ulp apart, the rest identical.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from detrkit.models.postprocess import keypoint_outputs, top_detections, top_keypoint_detections

DATA = torch.load(Path(__file__).parents[1] / "data" / "keypoint_postprocess_reference.pt", weights_only=True)


def naive_keypoints(keypoints, label, score, size, schema, alpha):
    """One detection, keypoint by keypoint, in float64: (score, (W, 3) keypoints, (W, 3) precision)."""
    width, (height, image_width) = max(schema), size
    points = torch.zeros(width, 3, dtype=torch.float64)
    precision = torch.full((width, 3), math.nan, dtype=torch.float64)
    if label >= len(schema):
        return score, points, precision
    weighted = weights = 0.0
    for k in range(schema[label]):
        x, y, findable, _, log_l11, l21, log_l22, _ = keypoints[label * width + k].double().tolist()
        points[k] = torch.tensor([x * image_width, y * height, 1 / (1 + math.exp(-findable))], dtype=torch.float64)
        precision[k] = torch.tensor([log_l11, l21, log_l22], dtype=torch.float64)
        l11, l22 = math.exp(log_l11), math.exp(log_l22)
        cholesky = torch.tensor([[l11, 0.0], [l21, l22]], dtype=torch.float64)
        covariance = torch.linalg.inv(cholesky @ cholesky.T)  # the precision's inverse
        weight = 1 / (1 + math.exp(-findable))
        weighted, weights = weighted + weight * float(covariance.trace()), weights + weight
    if alpha > 0:
        log_mean = math.log(weighted / weights) if weights else 0.0
        score = min(1 / (1 + math.exp(-(math.log(score) - alpha * log_mean))), 1 - 2**-24)
    return score, points, precision


def test_keypoint_outputs_match_a_per_detection_twin():
    generator = torch.Generator().manual_seed(3)
    schema, batch, count = [2, 4, 0], 2, 12
    keypoints = torch.randn(batch, count, 3 * 4, 8, generator=generator)
    keypoints[..., 4:7] = keypoints[..., 4:7].clamp(-2, 2)
    labels = torch.randint(0, 5, (batch, count), generator=generator)
    scores = torch.rand(batch, count, generator=generator)
    sizes = torch.tensor([[90, 160], [33, 47]])
    for alpha in (0.0, 0.3):
        fused, points, precision = keypoint_outputs(keypoints.double(), labels, scores.double(), sizes, schema, alpha)
        for b in range(batch):
            for i in range(count):
                score, point, chol = naive_keypoints(keypoints[b, i], int(labels[b, i]), float(scores[b, i]),
                                                     sizes[b].tolist(), schema, alpha)
                assert fused[b, i].item() == pytest.approx(score, rel=1e-12)
                torch.testing.assert_close(points[b, i], point, rtol=1e-12, atol=0)
                torch.testing.assert_close(precision[b, i], chol, rtol=0, atol=0, equal_nan=True)


def test_fused_scores_stay_below_one_and_without_keypoint_classes_nothing_changes():
    keypoints = torch.zeros(1, 2, 2, 8)
    keypoints[..., 4] = keypoints[..., 6] = 200.0  # a vanishing trace drives the fused score to 1
    scores = torch.tensor([[0.99, 0.5]])
    fused, _, _ = keypoint_outputs(keypoints, torch.tensor([[0, 1]]), scores, torch.tensor([[8, 8]]), [2], 0.2)
    assert fused[0, 0] == torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)) and fused[0, 1] == 0.5
    fused, points, precision = keypoint_outputs(keypoints, torch.tensor([[0, 1]]), scores, torch.tensor([[8, 8]]),
                                                [], 0.2)
    assert torch.equal(fused, scores) and points.shape == precision.shape == (1, 2, 0, 3)


@pytest.mark.parametrize("case", sorted(DATA))
def test_top_keypoint_detections_equal_the_reference_postprocess(case):
    data = DATA[case]
    schema = data["schema"].tolist()
    results = top_keypoint_detections(data["pred_logits"], data["pred_boxes"], data["pred_keypoints"], data["sizes"],
                                      data["num_select"], schema, data["alpha"])
    assert all(set(result) == {"scores", "labels", "boxes", "keypoints", "keypoint_precision_cholesky"}
               for result in results)
    for name, key in (("labels", "labels"), ("boxes", "boxes"), ("keypoints", "keypoints"),
                      ("keypoint_precision_cholesky", "precision")):
        ours = torch.stack([result[name] for result in results])
        assert torch.equal(ours.isnan(), data[key].isnan()) and torch.equal(ours.nan_to_num(), data[key].nan_to_num())
    # fused scores within one float32 ulp: log and sigmoid run over other tensor shapes there
    # (a few elements land in another vector lane); their log mean traces are bit-identical
    scores = torch.stack([result["scores"] for result in results])
    assert torch.equal(torch.where(scores == data["scores"], scores, torch.nextafter(scores, data["scores"])),
                       data["scores"])
    boxes_only = top_detections(data["pred_logits"], data["pred_boxes"], data["sizes"], data["num_select"])
    assert all(torch.equal(a["labels"], b["labels"]) and torch.equal(a["boxes"], b["boxes"])
               for a, b in zip(results, boxes_only))
    if data["alpha"] == 0:
        assert all(torch.equal(a["scores"], b["scores"]) for a, b in zip(results, boxes_only))
