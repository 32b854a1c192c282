"""YOLO reader: class names from YAML, boxes and polygons, background images, errors; the
Roboflow and Ultralytics layouts, data.yaml split entries (folders, list files, lists), symlinks."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from tiny_data import ultralytics_yolo, write_image

from detrkit.datasets.transforms import build_eval_transform
from detrkit.datasets.yolo import YoloDetection, label_path, yolo_splits

EVAL = build_eval_transform(64)
DATA = "names: [cat, dog]\n"


def train_images(root: Path) -> list[Path]:
    return sorted((root / "train/images").iterdir())


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
        dataset = YoloDetection(train_images(yolo_dir), ["cat", "dog"], EVAL)
    assert len(caught) == 1 and "dropped 2 degenerate boxes" in str(caught[0].message)
    assert str(yolo_dir / "train/labels") in str(caught[0].message)
    assert len(dataset[1][1].boxes) == 1


def test_class_index_out_of_range_names_file_line_and_value(yolo_dir):
    label_file = yolo_dir / "train/labels/a.txt"
    label_file.write_text("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n")
    with pytest.raises(ValueError, match=re.escape(f"{label_file} line 2: class 5")):
        YoloDetection(train_images(yolo_dir), ["cat", "dog"], EVAL)


def test_malformed_line_is_named(yolo_dir):
    (yolo_dir / "train/labels/a.txt").write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(ValueError, match="line 1: expected 'cls cx cy w h'"):
        YoloDetection(train_images(yolo_dir), ["cat", "dog"], EVAL)


def test_yaml_without_names_is_an_error_naming_the_file(yolo_dir):
    (yolo_dir / "data.yaml").write_text("nc: 2\n")
    with pytest.raises(ValueError, match=re.escape(f"{yolo_dir / 'data.yaml'} needs a 'names' entry")):
        yolo_splits(yolo_dir, EVAL, EVAL)


def test_missing_valid_split_names_the_folders_looked_for(yolo_dir):
    (yolo_dir / "valid").rename(yolo_dir / "elsewhere")
    with pytest.raises(FileNotFoundError, match="has no valid split") as error:
        yolo_splits(yolo_dir, EVAL, EVAL)
    for looked in ("valid/images", "val/images", "images/val"):
        assert str(yolo_dir / looked) in str(error.value)
    assert "'val:' or 'valid:'" in str(error.value) and str(yolo_dir / "data.yaml") in str(error.value)


def assert_tiny_split(dataset, root: Path, folder: str) -> None:
    """a.png (box + polygon) then b.png (background), ids 0 and 1, in `folder`."""
    assert [r.path for r in dataset.records] == [root / folder / "a.png", root / folder / "b.png"]
    assert [r.image_id for r in dataset.records] == [0, 1]
    assert dataset.records[0].labels.tolist() == [0, 1] and len(dataset.records[1].labels) == 0


@pytest.mark.parametrize("names", ["[cat, dog]", "{0: cat, 1: dog}", "{'1': dog, '0': cat}"])
def test_ultralytics_layout_with_folder_entries(tmp_path, names):
    root = ultralytics_yolo(tmp_path / "ds", f"path: .\ntrain: images/train\nval: images/val\nnc: 2\nnames: {names}\n")
    train, valid, test = yolo_splits(root, EVAL, EVAL)
    assert train.class_names == ["cat", "dog"] and test is None
    assert_tiny_split(train, root, "images/train")
    assert_tiny_split(valid, root, "images/val")
    torch.testing.assert_close(train[0][1].boxes, torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.2, 0.4, 0.2, 0.4]]))


def test_ultralytics_layout_without_split_keys_uses_the_conventional_folders(tmp_path):
    root = ultralytics_yolo(tmp_path / "ds", DATA, splits=("train", "val", "test"))
    train, valid, test = yolo_splits(root, EVAL, EVAL)
    assert_tiny_split(valid, root, "images/val")
    assert_tiny_split(test, root, "images/test")


@pytest.mark.parametrize("yaml_folder, path_line", [("data", ""), (".", "path: data\n"),
                                                   (".", "path: ./data/\n"), (".", "path: {absolute}\n")])
def test_entries_are_relative_to_path_which_is_relative_to_the_yaml(tmp_path, yaml_folder, path_line):
    data = ultralytics_yolo(tmp_path / "data", "")
    root = tmp_path / yaml_folder  # without path: entries start at the YAML's own folder
    (root / "data.yaml").write_text(path_line.format(absolute=data) + "train: images/train\nval: images/val\n" + DATA)
    assert_tiny_split(yolo_splits(root, EVAL, EVAL)[0], data, "images/train")


def test_path_that_is_not_a_folder_falls_back_to_the_yaml_folder_with_a_warning(tmp_path):
    # Ultralytics' coco8.yaml says `path: coco8` for a folder that is itself coco8
    root = ultralytics_yolo(tmp_path / "coco8", "path: coco8\ntrain: images/train\nval: images/val\n" + DATA)
    with pytest.warns(UserWarning, match=re.escape(f"({root / 'coco8'}) is not a folder")):
        train, _, _ = yolo_splits(root, EVAL, EVAL)
    assert_tiny_split(train, root, "images/train")


def test_list_file_entries_absolute_dot_relative_and_path_relative(tmp_path):
    root = ultralytics_yolo(tmp_path / "ds", "train: lists/train.txt\nval: [images/val]\n" + DATA)
    (root / "lists").mkdir()
    # './' is the list file's folder (Ultralytics), a bare relative path starts at `path:`
    (root / "lists/b").symlink_to(root / "images/train/b.png")
    (root / "lists/train.txt").write_text(f"./b\n\n{root / 'images/train/b.png'}\nimages/train/a.png\n")
    with pytest.raises(ValueError, match=re.escape(f"line 1 names {root / 'lists/b'}, which is not an image")):
        yolo_splits(root, EVAL, EVAL)
    (root / "lists/b").unlink()
    (root / "lists/b.png").symlink_to(root / "images/train/b.png")
    (root / "lists/train.txt").write_text(f"./b.png\n\n{root / 'images/train/b.png'}\nimages/train/a.png\n")
    train, valid, _ = yolo_splits(root, EVAL, EVAL)
    assert [r.path for r in train.records] == [root / "images/train/a.png", root / "images/train/b.png",
                                               root / "lists/b.png"]  # sorted, so ids are deterministic
    assert train.records[2].labels.tolist() == []  # lists/b.txt does not exist: background
    assert_tiny_split(valid, root, "images/val")


def test_a_list_of_entries_is_merged_in_sorted_order_with_nested_folders(tmp_path):
    root = ultralytics_yolo(tmp_path / "ds", "train: [images/val, images/train]\nval: images/val\n" + DATA)
    write_image(root / "images/train/deep/c.png", 100, 50, seed=2)
    (root / "labels/train/deep").mkdir()
    (root / "labels/train/deep/c.txt").write_text("1 0.5 0.5 0.2 0.2\n")
    train = yolo_splits(root, EVAL, EVAL)[0]
    assert [r.path.relative_to(root).as_posix() for r in train.records] == [
        "images/train/a.png", "images/train/b.png", "images/train/deep/c.png", "images/val/a.png", "images/val/b.png"]
    assert train.records[2].labels.tolist() == [1]


@pytest.mark.parametrize("entry, setup, message", [
    ("images/nowhere", None, "resolves to {root}/images/nowhere, which does not exist"),
    ("empty.txt", "", "list file {root}/empty.txt names no images"),
    ("gone.txt", "images/val/a.png\nimages/val/gone.png\n", "line 2 names {root}/images/val/gone.png"),
    ("labels/val", None, "(folder {root}/labels/val) holds no images"),
])
def test_an_entry_that_resolves_to_nothing_is_named_before_labels_are_read(tmp_path, entry, setup, message):
    root = ultralytics_yolo(tmp_path / "ds", f"train: images/train\nval: {entry}\n" + DATA)
    if setup is not None:
        (root / entry).write_text(setup)
    (root / "labels/train/a.txt").write_text("9 0.5 0.5 0.1 0.1\n")  # would fail if it were read first
    with pytest.raises(FileNotFoundError, match=re.escape(message.format(root=root))) as error:
        yolo_splits(root, EVAL, EVAL)
    assert f"{root / 'data.yaml'}: valid entry {entry!r}" in str(error.value)


def test_nc_that_disagrees_with_names_names_the_yaml_and_both_counts(tmp_path):
    root = ultralytics_yolo(tmp_path / "ds", "nc: 3\nnames: [cat, dog]\n")
    with pytest.raises(ValueError, match=re.escape(f"{root / 'data.yaml'}: nc is 3 but 'names' lists 2 classes")):
        yolo_splits(root, EVAL, EVAL)


def test_roboflow_yaml_with_parent_relative_entries_and_no_test_folder(yolo_dir):
    (yolo_dir / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\nnc: 2\nnames: ['cat', 'dog']\n")
    with pytest.warns(UserWarning, match=re.escape(f"skipping the test split: {yolo_dir / 'data.yaml'}")):
        train, valid, test = yolo_splits(yolo_dir, EVAL, EVAL)
    assert test is None and len(valid) == 2
    assert_tiny_split(train, yolo_dir, "train/images")


def test_symlinked_split_folders_resolve_and_keep_their_label_folders(tmp_path, yolo_dir):
    elsewhere = tmp_path / "elsewhere"
    (yolo_dir / "valid").rename(elsewhere)
    os.symlink(elsewhere, yolo_dir / "valid")  # Roboflow: the whole split folder is a link
    assert_tiny_split(yolo_splits(yolo_dir, EVAL, EVAL)[1], yolo_dir, "valid/images")
    root = ultralytics_yolo(tmp_path / "ds", "train: images/train\nval: images/val\n" + DATA)
    (root / "images/val").rename(tmp_path / "val_images")
    os.symlink(tmp_path / "val_images", root / "images/val")  # Ultralytics: an image folder is a link
    assert_tiny_split(yolo_splits(root, EVAL, EVAL)[1], root, "images/val")


def test_label_path_swaps_the_rightmost_images_folder():
    assert label_path(Path("/images/ds/images/train/x.y.jpg")) == Path("/images/ds/labels/train/x.y.txt")
    assert label_path(Path("/ds/train/images/a.png")) == Path("/ds/train/labels/a.txt")
    assert label_path(Path("/ds/pictures/a.png")) == Path("/ds/pictures/a.txt")  # no images folder: beside it


def test_split_without_any_label_file_warns(yolo_dir):
    for label_file in (yolo_dir / "train/labels").iterdir():
        label_file.unlink()
    with pytest.warns(UserWarning, match=re.escape(f"looked for {yolo_dir / 'train/labels/a.txt'}")):
        YoloDetection(train_images(yolo_dir), ["cat", "dog"], EVAL)
