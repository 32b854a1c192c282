"""Reading keypoints: COCO keypoint files (Roboflow and COCO 2017 layouts), YOLO pose, the schema and
label slots they give, their errors, and build_datasets' keypoint wiring."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tiny_data import annotation, coco_file, write_image
from torchvision.transforms import v2

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.coco import CocoDetection, roboflow_splits
from detrkit.datasets.detect import build_datasets, detect_format
from detrkit.datasets.synthetic import CORNERS, make_synthetic_dataset
from detrkit.datasets.yolo import yolo_splits

KEEP = v2.Compose([v2.ToDtype(torch.float32, scale=True)])  # pixels as they are: image = source size
CATS = [{"id": 1, "name": "cat", "supercategory": "animal", "keypoints": ["left_eye", "right_eye", "nose"],
         "skeleton": [[1, 3], [2, 3]]},
        {"id": 2, "name": "dog", "supercategory": "animal", "keypoints": ["left_ear", "right_ear"]},
        {"id": 3, "name": "ball", "supercategory": "thing"}]


def coco_keypoints_file(folder: Path, annotations=None, categories=CATS) -> Path:
    """One 200 x 100 image: a cat with 3 keypoints (one unlabelled), a dog with 2, a ball."""
    annotations = annotations if annotations is not None else [
        annotation(1, [20, 10, 60, 40], keypoints=[30, 20, 2, 70, 25, 1, 11, 12, 0], num_keypoints=2),
        annotation(2, [100, 50, 50, 30], category_id=2, keypoints=[110, 60, 2, 140, 60, 2]),
        annotation(3, [0, 0, 10, 10], category_id=3)]
    return coco_file(folder, annotations, categories)


def test_coco_keypoints_are_read_normalised_and_padded_to_the_widest_class(tmp_path):
    dataset = CocoDetection(coco_keypoints_file(tmp_path), tmp_path, KEEP, keypoints=[])
    schema = dataset.keypoint_schema
    assert schema.num_keypoints_per_class == (3, 2, 0) and schema.flip_pairs == ((0, 1),)
    assert schema.names[:2] == (("left_eye", "right_eye", "nose"), ("left_ear", "right_ear"))
    _, target = dataset[0]
    expected = torch.tensor([[[30 / 200, 20 / 100, 2], [70 / 200, 25 / 100, 1], [0, 0, 0]],
                             [[110 / 200, 60 / 100, 2], [140 / 200, 60 / 100, 2], [0, 0, 0]],
                             [[0, 0, 0]] * 3])
    torch.testing.assert_close(target.keypoints, expected)


def test_coco_ground_truth_carries_keypoints_in_pixels(tmp_path):
    truth = CocoDetection(coco_keypoints_file(tmp_path), tmp_path, KEEP, keypoints=[]).coco_ground_truth()
    cat = truth["annotations"][0]
    assert cat["keypoints"] == pytest.approx([30, 20, 2, 70, 25, 1, 0, 0, 0]) and cat["num_keypoints"] == 2
    assert truth["categories"][0]["keypoints"] == ["left_eye", "right_eye", "nose"]
    assert truth["categories"][0]["skeleton"] == [[1, 3], [2, 3]]


@pytest.mark.parametrize("values, message", [
    ([30, 20, 2, 70, 25, 1], "annotation 7 has 6 keypoint values but its category 1 has 3 keypoints"),
    ([30, 20, 2, 70, 25, 3, 1, 1, 1], "annotation 7: keypoint 1 has visibility 3; expected 0, 1 or 2"),
    ([30, 20, 2, 70], "annotation 7 has 4 keypoint values; expected flat x, y, v triples"),
])
def test_bad_coco_keypoints_name_the_file_and_annotation(tmp_path, values, message):
    path = coco_keypoints_file(tmp_path, [annotation(7, [20, 10, 60, 40], keypoints=values)])
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        CocoDetection(path, tmp_path, KEEP, keypoints=[])


def test_categories_without_names_take_their_count_from_the_vectors(tmp_path):
    categories = [{"id": 4, "name": "hand"}, {"id": 9, "name": "cup"}]
    path = coco_file(tmp_path, [annotation(1, [1, 1, 50, 50], category_id=4, keypoints=[5, 5, 2] * 5),
                                annotation(2, [60, 1, 50, 50], category_id=9)], categories)
    dataset = CocoDetection(path, tmp_path, KEEP, keypoints=[])
    assert dataset.keypoint_schema.num_keypoints_per_class == (5, 0)
    assert dataset.keypoint_schema.flip_pairs is None  # unnamed: the pairs are unknown


@pytest.mark.parametrize("model_counts, names", [([0, 3], ["ball", "cat"]), ([3], ["cat", "ball"]),
                                                 ([0, 0, 3], ["ball", "unused_1", "cat"])])
def test_keypoint_categories_take_the_schemas_keypoint_slots(tmp_path, model_counts, names):
    categories = [CATS[2], CATS[0]]
    path = coco_keypoints_file(tmp_path, [annotation(1, [20, 10, 60, 40], keypoints=[30, 20, 2] * 3),
                                          annotation(2, [100, 50, 50, 30], category_id=3)], categories)
    dataset = CocoDetection(path, tmp_path, KEEP, keypoints=model_counts)
    assert dataset.class_names == names
    _, target = dataset[0]
    assert target.labels.tolist() == [names.index("cat"), names.index("ball")]
    assert target.keypoints.shape == (2, 3, 3) and target.keypoints[0, 0, 2] == 2


def test_more_keypoint_categories_than_keypoint_slots_is_an_error(tmp_path):
    path = coco_keypoints_file(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{path} has 2 categories with keypoints but num_keypoints")):
        CocoDetection(path, tmp_path, KEEP, keypoints=[3])


def test_roboflow_parent_category_is_dropped_and_valid_reuses_the_train_schema(tmp_path):
    categories = [{"id": 0, "name": "animals", "supercategory": "none"},
                  {**CATS[0], "supercategory": "animals"}]
    for split in ("train", "valid"):
        coco_keypoints_file(tmp_path / split, [annotation(1, [20, 10, 60, 40], keypoints=[30, 20, 2] * 3)],
                            categories)
    train, valid, test = roboflow_splits(tmp_path, KEEP, KEEP, keypoints=[])
    assert train.class_names == ["cat"] and test is None
    assert valid.keypoint_schema is train.keypoint_schema and valid[0][1].keypoints.shape == (1, 3, 3)


def test_coco2017_keypoint_models_read_the_person_keypoints_files(tmp_path, tiny_kwargs):
    person = [{"id": 1, "name": "person", "supercategory": "person", "keypoints": ["left_hand", "right_hand"]}]
    for folder in ("train2017", "val2017"):
        coco_file(tmp_path / folder, [annotation(1, [20, 10, 60, 40], keypoints=[30, 20, 2, 50, 20, 2])], person)
        (tmp_path / "annotations").mkdir(exist_ok=True)
        (tmp_path / folder / "_annotations.coco.json").rename(tmp_path / f"annotations/person_keypoints_{folder}.json")
    assert detect_format(tmp_path) == "coco"
    splits = build_datasets(TrainConfig(dataset_dir=str(tmp_path)), ModelConfig(**tiny_kwargs), keypoints=True)
    assert splits.keypoint_schema.num_keypoints_per_class == (2,) and splits.keypoint_flip.pairs == ((0, 1),)
    assert splits.train[0][1].keypoints.shape[1:] == (2, 3)


def pose_dir(root: Path, yaml: str, line: str) -> Path:
    for split in ("train", "valid"):
        write_image(root / split / "images" / "a.png", 100, 50)
        (root / split / "labels").mkdir(parents=True)
        (root / split / "labels" / "a.txt").write_text(line + "\n")
    (root / "data.yaml").write_text(yaml)
    return root


def test_yolo_pose_with_visibility(tmp_path):
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [3, 3]\nflip_idx: [1, 0, 2]\n",
                    "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.45 1 0.9 0.9 0")
    train, _, _ = yolo_splits(root, KEEP, KEEP, keypoints=[])
    assert train.keypoint_schema.num_keypoints_per_class == (3,) and train.keypoint_schema.flip_pairs == ((0, 1),)
    _, target = train[0]
    torch.testing.assert_close(target.keypoints, torch.tensor([[[0.4, 0.4, 2], [0.6, 0.45, 1], [0, 0, 0]]]))
    torch.testing.assert_close(target.boxes, torch.tensor([[0.5, 0.5, 0.4, 0.4]]))


def test_yolo_pose_without_visibility_reads_negative_coordinates_as_absent(tmp_path):
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [2, 2]\nkpt_names: [left_hand, right_hand]\n",
                    "0 0.5 0.5 0.4 0.4 0.4 0.4 -1 -1")
    train, _, _ = yolo_splits(root, KEEP, KEEP, keypoints=[])
    assert train.keypoint_schema.flip_pairs == ((0, 1),)  # from the names
    torch.testing.assert_close(train[0][1].keypoints, torch.tensor([[[0.4, 0.4, 2], [0, 0, 0]]]))


@pytest.mark.parametrize("line, message", [
    ("0 0.5 0.5 0.4 0.4 0.4 0.4 2", "line 1: a pose line is 'cls cx cy w h' and 2 keypoints of 3 values"),
    ("0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 5", "line 1: keypoint 1 has visibility 5"),
])
def test_bad_yolo_pose_lines_name_the_label_file_and_line(tmp_path, line, message):
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [2, 3]\n", line)
    with pytest.raises(ValueError, match=re.escape(f"{root / 'train/labels/a.txt'} {message}")):
        yolo_splits(root, KEEP, KEEP, keypoints=[])


def test_yolo_pose_read_without_keypoints_keeps_the_boxes(tmp_path):
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [1, 3]\n", "0 0.5 0.5 0.4 0.4 0.4 0.4 2")
    _, target = yolo_splits(root, KEEP, KEEP)[0][0]
    assert target.keypoints is None and target.boxes.shape == (1, 4)


@pytest.mark.parametrize("yaml, message", [("names: [person]\n", "has no kpt_shape"),
                                           ("names: [p]\nkpt_shape: [2, 4]\n", "kpt_shape must be"),
                                           ("names: [p]\nkpt_shape: [2, 2]\nflip_idx: [0]\n", "flip_idx must list 2")])
def test_yolo_pose_yaml_errors_name_the_file(tmp_path, yaml, message):
    root = pose_dir(tmp_path, yaml, "0 0.5 0.5 0.4 0.4")
    with pytest.raises(ValueError, match=re.escape(str(root / "data.yaml")) + ".*" + re.escape(message)):
        yolo_splits(root, KEEP, KEEP, keypoints=[])


def test_build_datasets_reads_keypoints_when_the_model_has_keypoint_heads(tmp_path, tiny_kwargs):
    root = make_synthetic_dataset(tmp_path, num_train=2, num_valid=1, image_size=(96, 64), keypoints=True)
    config = TrainConfig(dataset_dir=str(root))
    assert build_datasets(config, ModelConfig(**tiny_kwargs)).valid[0][1].keypoints is None
    splits = build_datasets(config, ModelConfig(**tiny_kwargs, use_grouppose_keypoints=True))
    assert splits.keypoint_schema.num_keypoints_per_class == (4, 4, 4)
    assert splits.keypoint_schema.names[0] == CORNERS and splits.keypoint_flip.pairs == ((0, 1), (2, 3))
    _, target = splits.valid[0]
    assert target.keypoints.shape == (len(target.labels), 4, 3) and (target.keypoints[..., 2] == 2).all()
    _, target = splits.train[0]  # a crop may cut corners off: those read (0, 0, 0)
    assert target.keypoints.shape == (len(target.labels), 4, 3)


MIRRORING = [(None, "torchvision"), ({"VerticalFlip": {"p": 0.5}}, "albumentations"),
             ({"HorizontalFlip": {"p": 0.5}}, "kornia")]


@pytest.mark.parametrize("aug_config, backend", MIRRORING)
def test_mirroring_without_a_flip_map_fails_before_training(tmp_path, tiny_kwargs, aug_config, backend):
    pytest.importorskip(backend if backend != "torchvision" else "torch")
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [2, 3]\n", "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 2")
    config = TrainConfig(dataset_dir=str(root), aug_config=aug_config, augmentation_backend=backend)
    with pytest.raises(ValueError, match=re.escape(str(root / "data.yaml")) + " does not name its keypoints"):
        build_datasets(config, ModelConfig(**tiny_kwargs), keypoints=True)


def test_a_pipeline_without_mirrors_or_a_given_map_trains_unnamed_keypoints(tmp_path, tiny_kwargs):
    root = pose_dir(tmp_path, "names: [person]\nkpt_shape: [2, 3]\n", "0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.4 2")
    splits = build_datasets(TrainConfig(dataset_dir=str(root), aug_config={}), ModelConfig(**tiny_kwargs),
                            keypoints=True)
    assert splits.keypoint_flip.pairs is None and splits.train[0][1].keypoints.shape[1:] == (2, 3)
    config = TrainConfig(dataset_dir=str(root), keypoint_flip_pairs=[0, 1])
    assert build_datasets(config, ModelConfig(**tiny_kwargs), keypoints=True).keypoint_flip.pairs == ((0, 1),)


def test_keypoint_names_without_sides_flip_without_relabelling(tmp_path, tiny_kwargs):
    categories = [{"id": 1, "name": "fish", "keypoints": ["head", "tail"]}]
    for split in ("train", "valid"):
        coco_keypoints_file(tmp_path / split, [annotation(1, [20, 10, 60, 40], keypoints=[25, 20, 2, 70, 20, 2])],
                            categories)
    splits = build_datasets(TrainConfig(dataset_dir=str(tmp_path)), ModelConfig(**tiny_kwargs), keypoints=True)
    assert splits.keypoint_flip.pairs == ()
    assert splits.train[0][1].keypoints.shape[1:] == (2, 3)
