"""Tests that predict() on keypoint models returns supervision KeyPoints in source pixels with a
pixel covariance per keypoint, shaped as rfdetr's (spec 9, 10.1-10.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import supervision as sv
import torch
import torch.nn.functional as F
from test_predict import MEAN, STD, photo
from tiny_config import TINY

from detrkit.models.postprocess import keypoint_pixel_covariance
from detrkit.variants import RFDETRKeypointPreview

KEYPOINTS = dict(use_grouppose_keypoints=True, dual_projector=True, dual_projector_kp_only=True,
                 num_keypoints_per_class=[4, 2, 4], patch_size=16, num_windows=2, num_classes=3)
NAMES = ["circle", "square", "triangle"]


def tiny_pose(seed: int = 0, **changes) -> RFDETRKeypointPreview:
    """A tiny keypoint model whose keypoint head is not at its zero init, so that every keypoint
    has its own location, findability and precision."""
    torch.manual_seed(seed)
    model = RFDETRKeypointPreview(**{**TINY, **KEYPOINTS, **changes})
    last = model.model.keypoint_embed.layers[-1]
    with torch.no_grad():
        last.weight.normal_(0, 0.2)
        last.bias.normal_(0, 0.5)
    model.class_names = list(NAMES)
    return model


def hand_covariance(log_l11: float, l21: float, log_l22: float, height: int, width: int) -> np.ndarray:
    """The inverse of the precision L Lᵀ by numpy, scaled to pixels."""
    lower = np.array([[math.exp(log_l11), 0.0], [l21, math.exp(log_l22)]])
    scale = np.diag([width, height])
    return scale @ np.linalg.inv(lower @ lower.T) @ scale


def manual_key_points(model: RFDETRKeypointPreview, image: np.ndarray, threshold: float) -> list[dict]:
    """The spec's pipeline, one (query, class) pair at a time, from the raw outputs: the kept
    detections' fused scores, labels, keypoints, findability and pixel covariances."""
    height, width = image.shape[:2]
    pixels = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    pixels = F.interpolate(pixels[None], size=(64, 64), mode="bilinear", align_corners=False, antialias=False)
    with torch.no_grad():
        out = model.model((pixels - MEAN) / STD)
    probs, keypoints = out.pred_logits[0].sigmoid().double(), out.pred_keypoints[0].double()  # (Q, C), (Q, 12, 8)
    pairs = sorted(((probs[q, c].item(), q, c) for q in range(probs.shape[0]) for c in range(probs.shape[1])),
                   key=lambda pair: -pair[0])[: model.model_config.num_select]
    schema, alpha = model.model_config.num_keypoints_per_class, model.model_config.postprocess_trace_alpha
    rows = []
    for score, query, label in pairs:
        row = {"label": label, "xy": np.zeros((4, 2)), "confidence": np.zeros(4),
               "covariance": np.full((4, 2, 2), np.nan)}
        if label < len(schema):
            traces, weights = [], []
            for k in range(schema[label]):
                x, y, findable, _, log_l11, l21, log_l22, _ = keypoints[query, label * 4 + k].tolist()
                row["xy"][k] = (x * width, y * height)
                row["confidence"][k] = 1 / (1 + math.exp(-findable))
                row["covariance"][k] = hand_covariance(log_l11, l21, log_l22, height, width)
                traces.append(np.trace(hand_covariance(log_l11, l21, log_l22, 1, 1)))  # normalised units
                weights.append(row["confidence"][k])
            log_trace = math.log(np.dot(weights, traces) / sum(weights))
            score = min(1 / (1 + math.exp(-(math.log(score) - alpha * log_trace))), 1 - 1e-7)
        row["score"] = score
        rows.append(row)
    return [row for row in rows if row["score"] > threshold]


def test_pixel_covariance_is_the_inverse_precision_scaled_by_the_image():
    params = torch.tensor([[[0.0, 0.0, 0.0], [0.5, 0.3, -0.2]], [[-1.0, -2.0, 1.5], [float("nan")] * 3]],
                          dtype=torch.float64)
    got = keypoint_pixel_covariance(params, (10, 20)).numpy()
    np.testing.assert_allclose(got[0, 0], [[400.0, 0.0], [0.0, 100.0]])  # unit precision: W², H²
    for n, k in ((0, 1), (1, 0)):
        np.testing.assert_allclose(got[n, k], hand_covariance(*params[n, k].tolist(), height=10, width=20),
                                   rtol=1e-12)
    assert np.isnan(got[1, 1]).all()  # an inactive keypoint
    sharp = keypoint_pixel_covariance(torch.tensor([[[800.0, 0.0, 0.0]]], dtype=torch.float64), (10, 20))
    assert np.isnan(sharp.numpy()).all()  # exp overflows: no finite covariance


@pytest.mark.parametrize("height, width", [(50, 80), (96, 72)])
def test_key_points_are_the_raw_outputs_in_source_pixels(height, width):
    model = tiny_pose()
    image = photo(height, width)
    threshold = float(np.median(model.predict(image, threshold=0.0).detection_confidence))
    got = model.predict(image, threshold=threshold)
    want = manual_key_points(model, image, threshold)
    assert isinstance(got, sv.KeyPoints) and 0 < len(got) == len(want) < model.model_config.num_select
    assert (got.detection_confidence > threshold).all()
    np.testing.assert_allclose(got.detection_confidence, [row["score"] for row in want], rtol=1e-5)
    np.testing.assert_array_equal(got.class_id, [row["label"] for row in want])
    np.testing.assert_allclose(got.xy, [row["xy"] for row in want], atol=1e-3)
    np.testing.assert_allclose(got.keypoint_confidence, [row["confidence"] for row in want], atol=1e-5)
    np.testing.assert_allclose(got.data["covariance"], [row["covariance"] for row in want], rtol=1e-3)
    np.testing.assert_array_equal(got.visible, got.keypoint_confidence > 0)
    assert got.xy.dtype == got.keypoint_confidence.dtype == got.data["covariance"].dtype == np.float32
    assert list(got.data["class_name"]) == [NAMES[c] if c < 3 else "__background__" for c in got.class_id]
    assert (got.data["source_shape"] == (height, width)).all()
    boxes = got.data["xyxy"]
    assert boxes.shape == (len(got), 4) and boxes.dtype == np.float32
    assert (boxes >= 0).all() and (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()


def test_unused_slots_of_a_class_with_fewer_keypoints_are_empty():
    got = tiny_pose(num_select=48).predict(photo(50, 80), threshold=0.0)  # every (query, class) pair
    fewer = got.class_id == 1  # two keypoints of four slots
    assert fewer.any()
    assert (got.xy[fewer, 2:] == 0).all() and not got.visible[fewer, 2:].any()
    assert np.isnan(got.data["covariance"][fewer, 2:]).all()
    assert np.isnan(got.data["keypoint_precision_cholesky"][fewer, 2:]).all()
    assert np.isfinite(got.data["covariance"][fewer, :2]).all()


def test_nothing_above_the_threshold_keeps_shapes_and_dtypes():
    got = tiny_pose().predict(photo(50, 80), threshold=1.0)
    assert isinstance(got, sv.KeyPoints) and len(got) == 0
    assert got.xy.shape == (0, 4, 2) and got.xy.dtype == np.float32
    assert got.keypoint_confidence.shape == (0, 4) and got.detection_confidence.shape == (0,)
    assert got.class_id.shape == (0,) and got.class_id.dtype == np.int64
    data = got.data
    assert data["xyxy"].shape == (0, 4) and data["covariance"].shape == (0, 4, 2, 2)
    assert data["keypoint_precision_cholesky"].shape == (0, 4, 3) and data["source_shape"].shape == (0, 2)
    assert len(data["source_image"]) == 0 and data["class_name"].shape == (0,)


def test_lists_batches_and_streams_give_the_same_key_points():
    model = tiny_pose()
    images = [photo(50, 80, seed=1), photo(72, 64, seed=2)]
    alone = [model.predict(image, threshold=0.3, include_source_image=False) for image in images]
    batched = model.predict(images, threshold=0.3)
    streamed = list(model.predict(iter(images), threshold=0.3, stream=True, batch=1))
    for one, many, stream in zip(alone, batched, streamed):
        assert len(one) == len(many) == len(stream) > 0
        for other in (many, stream):
            np.testing.assert_allclose(other.xy, one.xy, atol=1e-3)
            np.testing.assert_allclose(other.detection_confidence, one.detection_confidence, atol=1e-5)
            np.testing.assert_allclose(other.data["covariance"], one.data["covariance"], rtol=1e-3)
    assert "source_image" not in alone[0].data
    assert all(picture is batched[1].data["source_image"][0] for picture in batched[1].data["source_image"])
    np.testing.assert_array_equal(batched[1].data["source_image"][0], images[1])
    first = batched[0][:1]  # supervision indexing keeps every per-row field
    assert first.xy.shape == (1, 4, 2) and first.data["covariance"].shape == (1, 4, 2, 2)
