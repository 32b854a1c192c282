"""Format detection and build_datasets: configs to validated splits with the right transforms."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from tiny_data import ultralytics_yolo

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.detect import build_datasets, detect_format


def test_detects_roboflow_coco_and_yolo_layouts(roboflow_dir, yolo_dir, tmp_path):
    coco = tmp_path / "coco2017"
    (coco / "annotations").mkdir(parents=True)
    (coco / "annotations/instances_train2017.json").write_text("{}")
    assert (detect_format(roboflow_dir), detect_format(coco), detect_format(yolo_dir)) == ("roboflow", "coco", "yolo")


def test_unknown_layout_says_which_files_were_looked_for(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "train/_annotations.coco.json"))) as error:
        detect_format(tmp_path)
    assert "data.yaml" in str(error.value) and "instances_train2017.json" in str(error.value)


def test_missing_dataset_dir_is_named(tmp_path, tiny_kwargs):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        build_datasets(TrainConfig(dataset_dir=str(tmp_path / "nowhere")), ModelConfig(**tiny_kwargs))


def test_missing_valid_annotation_file_is_named(roboflow_dir, tiny_kwargs):
    (roboflow_dir / "valid/_annotations.coco.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(roboflow_dir / "valid/_annotations.coco.json"))):
        build_datasets(TrainConfig(dataset_dir=str(roboflow_dir)), ModelConfig(**tiny_kwargs))


@pytest.mark.parametrize("mode, train_sizes", [("off", {64}), ("per-batch", {224}),
                                               ("per-sample", {64, 96, 128, 160, 192, 224})])
def test_train_samples_are_resized_for_the_multi_scale_mode(roboflow_dir, tiny_kwargs, mode, train_sizes):
    config = TrainConfig(dataset_dir=str(roboflow_dir), multi_scale=mode, scale_jitter=False)
    splits = build_datasets(config, ModelConfig(**tiny_kwargs))  # resolution 64, block 32
    torch.manual_seed(0)
    assert {splits.train[0][0].shape[-1] for _ in range(25)} == train_sizes
    assert splits.valid[0][0].shape == (3, 64, 64)
    assert (splits.class_names, splits.num_classes, splits.test) == (["cat", "dog"], 2, None)


def test_aspect_keeping_mode_resizes_shortest_side(roboflow_dir, tiny_kwargs):
    config = TrainConfig(dataset_dir=str(roboflow_dir), square_resize_div_64=False, multi_scale="off")
    assert build_datasets(config, ModelConfig(**tiny_kwargs)).valid[0][0].shape == (3, 64, 128)


def test_explicit_dataset_file_and_test_split(roboflow_dir, tiny_kwargs):
    shutil.copytree(roboflow_dir / "valid", roboflow_dir / "test")
    splits = build_datasets(TrainConfig(dataset_dir=str(roboflow_dir), dataset_file="roboflow"),
                            ModelConfig(**tiny_kwargs))
    assert len(splits.test) == 1 and splits.test.class_names == ["cat", "dog"]


def test_class_names_must_match_the_data_set(roboflow_dir, tiny_kwargs):
    config = TrainConfig(dataset_dir=str(roboflow_dir), class_names=["dog", "cat"])
    with pytest.raises(ValueError, match=re.escape("['dog', 'cat'] differ from the class names ['cat', 'dog']")):
        build_datasets(config, ModelConfig(**tiny_kwargs))
    config = TrainConfig(dataset_dir=str(roboflow_dir), class_names=["cat", "dog"])
    assert build_datasets(config, ModelConfig(**tiny_kwargs)).class_names == ["cat", "dog"]


@pytest.mark.parametrize("layout", ["roboflow", "ultralytics"])
def test_both_yolo_layouts_build_from_the_dataset_dir_alone(yolo_dir, tmp_path, tiny_kwargs, layout):
    if layout == "ultralytics":
        yolo_dir = ultralytics_yolo(tmp_path / "ultra", "path: .\ntrain: images/train\nval: images/val\n"
                                    "names: {0: cat, 1: dog}\nnc: 2\n")
    assert detect_format(yolo_dir) == "yolo"
    splits = build_datasets(TrainConfig(dataset_dir=str(yolo_dir), multi_scale="off"), ModelConfig(**tiny_kwargs))
    assert (splits.class_names, splits.num_classes, len(splits.train), len(splits.valid)) == (["cat", "dog"], 2, 2, 2)
    assert splits.valid[0][1].labels.tolist() == [0, 1] and splits.valid[0][0].shape == (3, 64, 64)
    assert [image["id"] for image in splits.valid.coco_ground_truth()["images"]] == [0, 1]


def test_yolo_train_entry_that_resolves_to_nothing_fails_in_build_datasets(tmp_path, tiny_kwargs):
    root = ultralytics_yolo(tmp_path / "ultra", "train: images/missing\nval: images/val\nnames: [cat, dog]\n")
    with pytest.raises(FileNotFoundError, match=re.escape(f"resolves to {root / 'images/missing'}, which does not")):
        build_datasets(TrainConfig(dataset_dir=str(root)), ModelConfig(**tiny_kwargs))
