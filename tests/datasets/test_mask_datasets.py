"""Mask data sets end to end: the synthetic shapes' exact masks, and build_datasets switching masks
on for segmentation models only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.coco import CocoDetection
from detrkit.datasets.detect import build_datasets
from detrkit.datasets.segments import decode_masks
from detrkit.datasets.synthetic import class_colour, make_synthetic_dataset
from detrkit.datasets.transforms import build_eval_transform, build_train_transform
from detrkit.ops.boxes import cxcywh_to_xyxy

pytest.importorskip("pycocotools")


def mask_box(mask: torch.Tensor) -> list[float]:
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return [xs.min().item(), ys.min().item(), xs.max().item() + 1.0, ys.max().item() + 1.0]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("shapes"), num_train=6, num_valid=2,
                                  classes=("circle", "square", "triangle", "diamond"), seed=2)


def test_synthetic_masks_are_exact_polygons_with_the_box_as_bounds(shapes):
    data = json.loads((shapes / "train/_annotations.coco.json").read_text())
    dataset = CocoDetection(shapes / "train/_annotations.coco.json", shapes / "train", build_eval_transform(64),
                            masks=True)
    by_image = {}
    for item in data["annotations"]:
        by_image.setdefault(item["image_id"], []).append(item)
    for record in dataset.records:
        masks = decode_masks(record.mask_rles, record.size)
        pixels = np.asarray(Image.open(record.path)).astype(float)
        for mask, item in zip(masks, by_image.get(record.image_id, [])):
            x, y, w, h = item["bbox"]
            assert mask_box(mask) == [x, y, x + w, y + h] and mask.sum().item() == item["area"]
            colour = np.array(class_colour(item["category_id"] - 1, 4))
            inside = np.abs(pixels[mask.numpy()] - colour).max(1)  # the class hue, jittered and JPEG'd
            assert np.median(inside) < 60
            ring = torch.nn.functional.max_pool2d(mask[None, None].float(), 5, 1, 2)[0, 0].bool() & ~mask
            outside = pixels[ring.numpy()]
            assert (np.abs(outside - pixels[mask.numpy()].mean(0)).max(1) > 25).mean() > 0.5  # edges are the mask's


def test_synthetic_masks_follow_the_training_transform(shapes):
    dataset = CocoDetection(shapes / "train/_annotations.coco.json", shapes / "train",
                            build_train_transform([320, 384], square=True, scale_jitter=False), masks=True)
    for seed in range(len(dataset)):
        torch.manual_seed(seed)
        _, target = dataset[seed]
        height, width = target.size
        boxes = cxcywh_to_xyxy(target.boxes) * torch.tensor([width, height, width, height])
        assert target.masks.shape == (len(boxes), height, width)
        for box, mask in zip(boxes, target.masks):
            assert (torch.tensor(mask_box(mask)) - box).abs().max() <= 1.0


def test_build_datasets_reads_masks_for_segmentation_models_only(shapes, tiny_kwargs):
    config = TrainConfig(dataset_dir=str(shapes), scale_jitter=False, multi_scale="off")
    detection = build_datasets(config, ModelConfig(**tiny_kwargs))
    assert detection.train.records[0].mask_rles is None and detection.valid[0][1].masks is None
    segmentation = build_datasets(config, ModelConfig(**tiny_kwargs, segmentation_head=True))
    for split in (segmentation.train, segmentation.valid):
        _, target = split[0]
        assert target.masks is not None and target.masks.shape == (len(target.labels), 64, 64)
    assert build_datasets(config, ModelConfig(**tiny_kwargs), masks=True).train[0][1].masks is not None
