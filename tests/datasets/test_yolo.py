"""YOLO reader: class names from YAML, boxes and polygons, background images, errors."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from detrkit.datasets.transforms import build_eval_transform
from detrkit.datasets.yolo import YoloDetection, yolo_splits

EVAL = build_eval_transform(64)


def test_box_and_polygon_lines_become_normalised_cxcywh(yolo_dir):
    train, valid, test = yolo_splits(yolo_dir, EVAL, EVAL)
    assert train.class_names == ["cat", "dog"] and test is None and len(valid) == 2
    pixels, target = train[0]  # a.png, 100x50
    assert pixels.shape == (3, 64, 64) and target.orig_size == (50, 100)
    # polygon (0.1, 0.2) (0.3, 0.2) (0.2, 0.6) -> bounds x 0.1..0.3, y 0.2..0.6
    torch.testing.assert_close(target.boxes, torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.2, 0.4, 0.2, 0.4]]))
    assert target.labels.tolist() == [0, 1]
    torch.testing.assert_close(target.area, torch.tensor([20.0 * 20.0, 20.0 * 20.0]))
    assert target.crowd_boxes.shape == (0, 4) and target.crowd_labels.shape == (0,)  # YOLO has no crowds


def test_image_without_label_file_is_background(yolo_dir):
    _, target = yolo_splits(yolo_dir, EVAL, EVAL)[0][1]  # b.png
    assert target.boxes.shape == (0, 4) and target.image_id == 1


def test_data_yml_with_names_dict_and_val_folder(yolo_dir):
    (yolo_dir / "data.yaml").unlink()
    (yolo_dir / "data.yml").write_text("names:\n  1: dog\n  0: cat\n")
    (yolo_dir / "valid").rename(yolo_dir / "val")
    train, valid, _ = yolo_splits(yolo_dir, EVAL, EVAL)
    assert train.class_names == valid.class_names == ["cat", "dog"]


def test_coco_ground_truth_reads_image_sizes_from_headers(yolo_dir):
    truth = yolo_splits(yolo_dir, EVAL, EVAL)[0].coco_ground_truth()
    assert [(i["id"], i["width"], i["height"]) for i in truth["images"]] == [(0, 100, 50), (1, 100, 50)]
    boxes = [value for a in truth["annotations"] for value in a["bbox"]]
    assert boxes == pytest.approx([40.0, 15.0, 20.0, 20.0, 10.0, 10.0, 20.0, 20.0])
    assert [a["category_id"] for a in truth["annotations"]] == [0, 1]
    assert [a["id"] for a in truth["annotations"]] == [1, 2]


def test_degenerate_boxes_warn_once_per_split(yolo_dir):
    (yolo_dir / "train/labels/b.txt").write_text("0 0.5 0.5 0 0.1\n1 1.5 0.5 0.2 0.2\n0 0.5 0.5 0.1 0.1\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = YoloDetection(yolo_dir / "train", ["cat", "dog"], EVAL)
    assert len(caught) == 1 and "dropped 2 degenerate boxes" in str(caught[0].message)
    assert str(yolo_dir / "train/labels") in str(caught[0].message)
    assert len(dataset[1][1].boxes) == 1


def test_class_index_out_of_range_names_file_line_and_value(yolo_dir):
    label_file = yolo_dir / "train/labels/a.txt"
    label_file.write_text("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=re.escape(f"{label_file} line 2: class 5")):
        YoloDetection(yolo_dir / "train", ["cat", "dog"], EVAL)


def test_malformed_line_is_named(yolo_dir):
    (yolo_dir / "train/labels/a.txt").write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(ValueError, match="line 1: expected 'cls cx cy w h'"):
        YoloDetection(yolo_dir / "train", ["cat", "dog"], EVAL)


def test_yaml_without_names_is_an_error_naming_the_file(yolo_dir):
    (yolo_dir / "data.yaml").write_text("nc: 2\n")
    with pytest.raises(ValueError, match=re.escape(f"{yolo_dir / 'data.yaml'} needs a 'names' entry")):
        yolo_splits(yolo_dir, EVAL, EVAL)


def test_missing_valid_split_names_the_folders_looked_for(yolo_dir):
    (yolo_dir / "valid").rename(yolo_dir / "elsewhere")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{yolo_dir / 'valid'} or {yolo_dir / 'val'}")):
        yolo_splits(yolo_dir, EVAL, EVAL)
