"""Tests that predict() on segmentation models returns bool masks at the source size (spec 10.1-10.2)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import supervision as sv
import torch
import torch.nn.functional as F
from test_predict import MEAN, STD, photo
from tiny_config import TINY

from detrkit.config import PretrainWeightsCompatibilityWarning, SegmentationTrainConfig
from detrkit.losses.criterion import build_criterion
from detrkit.models.postprocess import detections_above, masks_at_size
from detrkit.structures import Target
from detrkit.variants import RFDETRSegNano

TINY_SEG = {**TINY, "patch_size": 16, "num_windows": 2}


def tiny_seg(seed: int = 0, **changes) -> RFDETRSegNano:
    torch.manual_seed(seed)
    return RFDETRSegNano(**{**TINY_SEG, **changes})


def manual_masks(model: RFDETRSegNano, image: np.ndarray, threshold: float) -> tuple[np.ndarray, torch.Tensor]:
    """The spec's pipeline by hand: (score, class) rows of the detections above `threshold`, and
    their queries' raw mask logits upsampled to the image and thresholded at 0."""
    height, width = image.shape[:2]
    pixels = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    pixels = F.interpolate(pixels[None], size=(64, 64), mode="bilinear", align_corners=False, antialias=False)
    with torch.no_grad():
        out = model.model((pixels - MEAN) / STD)
    probs = out.pred_logits[0].sigmoid()
    pairs = sorted(((probs[q, c].item(), q, c) for q in range(probs.shape[0]) for c in range(probs.shape[1])),
                   key=lambda pair: -pair[0])[: model.model_config.num_select]
    kept = [(score, query, label) for score, query, label in pairs if score > threshold]
    queries = torch.tensor([query for _, query, _ in kept], dtype=torch.long)
    logits = out.pred_masks[0][queries]  # (N, 16, 16)
    masks = masks_at_size(logits, tuple(logits.shape[-2:]), (height, width))
    return np.array([(score, label) for score, _, label in kept]).reshape(-1, 2), masks


def median_score(model: RFDETRSegNano, image: np.ndarray) -> float:
    return float(np.median(model.predict(image, threshold=0.0).confidence))


@pytest.mark.parametrize("height, width", [(50, 80), (96, 72)])
def test_masks_are_the_kept_queries_logits_upsampled_to_the_source(height, width):
    model = tiny_seg()
    image = photo(height, width)
    threshold = median_score(model, image)
    detections = model.predict(image, threshold=threshold)
    rows, want = manual_masks(model, image, threshold)
    assert 0 < len(detections) < model.model_config.num_select
    assert detections.mask.dtype == np.bool_ and detections.mask.shape == (len(detections), height, width)
    np.testing.assert_allclose(np.column_stack((detections.confidence, detections.class_id)), rows, atol=1e-5)
    np.testing.assert_array_equal(detections.mask, want.numpy())
    assert detections.mask.any() and not detections.mask.all()


def test_no_detection_gives_an_empty_bool_mask_of_the_source_size():
    detections = tiny_seg().predict(photo(30, 40), threshold=1.0)
    assert len(detections) == 0
    assert detections.mask.shape == (0, 30, 40) and detections.mask.dtype == np.bool_
    assert detections.xyxy.shape == (0, 4)


def test_detection_models_have_no_masks(tiny_kwargs):
    from detrkit import RFDETRNano

    assert RFDETRNano(**tiny_kwargs).predict(photo(30, 40), threshold=0.0).mask is None


def test_only_kept_detections_are_upsampled():
    logits = torch.randn(4, 8, 8)
    result = {"scores": torch.tensor([0.9, 0.5, 0.7, 0.2]), "labels": torch.arange(4), "boxes": torch.rand(4, 4),
              "masks": logits}
    kept = detections_above(result, 0.5, (20, 30))  # strict: 0.5 is dropped
    assert kept["labels"].tolist() == [0, 2]
    assert torch.equal(kept["masks"], masks_at_size(logits[[0, 2]], (8, 8), (20, 30)))


def test_batches_lists_and_streams_give_each_image_its_own_masks():
    model = tiny_seg()
    images = [photo(50, 80, seed=1), photo(70, 40, seed=2), photo(64, 64, seed=3)]
    threshold = median_score(model, images[0])
    singles = [model.predict(image, threshold=threshold) for image in images]
    batched = model.predict(images, threshold=threshold, batch=2)
    streamed = list(model.predict(iter(images), threshold=threshold, stream=True))
    for single, *others in zip(singles, batched, streamed):
        assert single.mask.shape[1:] == single.metadata["source_image"].shape[:2]
        for other in others:
            assert len(other) == len(single)
            # batching changes float rounding; a logit within it of 0 may flip a pixel
            assert (other.mask == single.mask).mean() > 0.999
            np.testing.assert_allclose(other.confidence, single.confidence, atol=1e-5)


@pytest.fixture(scope="module")
def fitted_seg() -> tuple[RFDETRSegNano, np.ndarray, np.ndarray]:
    """A tiny segmentation model fitted to one 64 x 64 image with a disc (class 1) and a triangle
    (class 3); the image as HWC uint8 and its two masks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainWeightsCompatibilityWarning)
        model = tiny_seg()
    rows, cols = np.mgrid[0:64, 0:64] + 0.5
    disc = (rows - 22) ** 2 + (cols - 20) ** 2 < 13 ** 2
    triangle = (rows > 34) & (rows < 60) & (np.abs(cols - 44) < (rows - 34) * 0.6)
    image = np.full((64, 64, 3), 90, np.uint8)
    image[disc] = (230, 40, 40)
    image[triangle] = (40, 60, 230)
    masks = np.stack([disc, triangle])
    boxes = []
    for mask in masks:
        ys, xs = np.nonzero(mask)
        x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        boxes.append([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0])
    target = Target(torch.tensor(boxes, dtype=torch.float32) / 64, torch.tensor([1, 3]), 0, (64, 64), (64, 64),
                    masks=torch.from_numpy(masks))
    criterion = build_criterion(model.model_config, SegmentationTrainConfig(dataset_dir=None))
    network = model.model.train()
    pixels = model._preparer(None)([torch.from_numpy(image).permute(2, 0, 1)])
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    for _ in range(120):
        loss = criterion(network(pixels), [target], groups=network.groups, image_size=pixels.shape[-2:]).total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    network.eval()
    return model, image, masks


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


@pytest.mark.parametrize("repeat", [1, 3])
def test_a_fitted_model_masks_cover_its_objects(fitted_seg, repeat):
    model, image, masks = fitted_seg
    # the same picture 3x larger: masks come back at the larger size, still on the objects
    image = image.repeat(repeat, 0).repeat(repeat, 1)
    masks = masks.repeat(repeat, 1).repeat(repeat, 2)
    detections = model.predict(image, threshold=0.0)
    for label, truth in zip((1, 3), masks):
        best = detections[detections.class_id == label][0]  # highest score first
        assert best.mask.shape == (1, *image.shape[:2])
        assert iou(best.mask[0], truth) > 0.7, (label, iou(best.mask[0], truth))
        assert isinstance(best, sv.Detections)
