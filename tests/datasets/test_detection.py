"""DetectionDataset: boxes a transform empties are dropped together with their labels and areas."""

from __future__ import annotations

import torch
from tiny_data import annotation, coco_file
from torchvision.transforms import v2

from detrkit.datasets.coco import CocoDetection
from detrkit.datasets.transforms import build_eval_transform


def test_boxes_cropped_away_are_dropped_with_their_labels_and_areas(tmp_path):
    path = coco_file(tmp_path, [annotation(0, [0, 0, 10, 10], category_id=2, area=7.0),
                                annotation(1, [20, 10, 60, 40], area=9.0)])
    crop = v2.Compose([v2.CenterCrop((100, 100)), build_eval_transform(50)])  # keeps x in 50..150
    pixels, target = CocoDetection(path, tmp_path, crop)[0]
    assert pixels.shape == (3, 50, 50) and target.size == (50, 50) and target.orig_size == (100, 200)
    # [20, 10, 80, 50] clamps to [50, 10, 80, 50] -> [0, 10, 30, 50] in the crop
    torch.testing.assert_close(target.boxes, torch.tensor([[0.15, 0.3, 0.3, 0.4]]))
    assert target.labels.tolist() == [0] and target.area.tolist() == [9.0]
