"""The synthetic shapes data set: determinism, box sizes and that each box holds its class colour."""

from __future__ import annotations

import filecmp
import json

import numpy as np
from PIL import Image

from detrkit.datasets.coco import CocoDetection
from detrkit.datasets.synthetic import CORNERS, class_colour, make_synthetic_dataset
from detrkit.datasets.transforms import build_eval_transform


def test_same_seed_writes_identical_files(tmp_path):
    first = make_synthetic_dataset(tmp_path / "a", num_train=3, num_valid=1, num_test=1, seed=3)
    second = make_synthetic_dataset(tmp_path / "b", num_train=3, num_valid=1, num_test=1, seed=3)
    for split in ("train", "valid", "test"):
        names = sorted(p.name for p in (first / split).iterdir())
        assert names == sorted(p.name for p in (second / split).iterdir())
        assert filecmp.cmpfiles(first / split, second / split, names, shallow=False)[0] == names
    other = make_synthetic_dataset(tmp_path / "c", num_train=3, num_valid=1, seed=4)
    assert (other / "train/_annotations.coco.json").read_text() != (first / "train/_annotations.coco.json").read_text()


def test_boxes_are_inside_sized_and_coloured_by_class(tmp_path):
    root = make_synthetic_dataset(tmp_path, num_train=6, num_valid=1, image_size=(160, 120), seed=1)
    data = json.loads((root / "train/_annotations.coco.json").read_text())
    assert data["annotations"] and len(data["images"]) == 6 and not (root / "test").exists()
    for item in data["annotations"]:
        x, y, w, h = item["bbox"]
        assert 0 <= x and 0 <= y and x + w <= 160 and y + h <= 120
        assert 0.1 * 120 - 3 <= min(w, h) and max(w, h) <= 0.3 * 120 and abs(w - h) <= 2  # a tip may miss a row
        pixels = np.asarray(Image.open(root / "train" / data["images"][item["image_id"]]["file_name"]))
        centre = pixels[int(y + h / 2) - 1: int(y + h / 2) + 2, int(x + w / 2) - 1: int(x + w / 2) + 2]
        expected = np.array(class_colour(item["category_id"] - 1, 3))
        nearest = min(range(3), key=lambda label: np.abs(centre.mean((0, 1)) - class_colour(label, 3)).sum())
        assert nearest == item["category_id"] - 1, (item, centre.mean((0, 1)), expected)


def test_reader_drops_the_parent_category(tmp_path):
    root = make_synthetic_dataset(tmp_path, num_train=2, num_valid=1, classes=("a", "b"))
    dataset = CocoDetection(root / "train/_annotations.coco.json", root / "train", build_eval_transform(64))
    assert dataset.class_names == ["a", "b"] and dataset.label_to_category_id == {0: 1, 1: 2}


def test_pose_option_writes_the_box_corners_as_named_keypoints(tmp_path):
    root = make_synthetic_dataset(tmp_path, num_train=3, num_valid=1, image_size=(160, 120), seed=2, keypoints=True)
    data = json.loads((root / "train/_annotations.coco.json").read_text())
    assert "keypoints" not in data["categories"][0]  # the Roboflow-style parent has none
    assert all(c["keypoints"] == list(CORNERS) and len(c["skeleton"]) == 4 for c in data["categories"][1:])
    for annotation in data["annotations"]:
        x, y, w, h = annotation["bbox"]
        assert annotation["keypoints"] == [x, y, 2, x + w - 1, y, 2, x + w - 1, y + h - 1, 2, x, y + h - 1, 2]
        assert annotation["num_keypoints"] == 4
    plain = make_synthetic_dataset(tmp_path / "plain", num_train=3, num_valid=1, image_size=(160, 120), seed=2)
    plain_data = json.loads((plain / "train/_annotations.coco.json").read_text())
    assert [a["bbox"] for a in plain_data["annotations"]] == [a["bbox"] for a in data["annotations"]]
