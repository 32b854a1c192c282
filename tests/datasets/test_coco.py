"""COCO readers: category mapping, boxes after transforms, crowd/background handling, errors."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from tiny_data import annotation, coco_file

from detrkit.datasets.coco import CocoDetection, coco2017_splits, roboflow_splits
from detrkit.datasets.transforms import build_eval_transform, build_train_transform

EVAL = build_eval_transform(64)


def categories(*entries: tuple[int, str, str]) -> list[dict]:
    return [{"id": i, "name": name, "supercategory": parent} for i, name, parent in entries]


def test_parent_category_without_annotations_is_dropped_and_labels_follow_id_order(tmp_path):
    cats = categories((2, "dog", "animals"), (0, "animals", "none"), (1, "cat", "animals"))
    path = coco_file(tmp_path, [annotation(0, [1, 1, 5, 5], category_id=2)], cats)
    dataset = CocoDetection(path, tmp_path, EVAL)
    assert dataset.class_names == ["cat", "dog"]
    assert dataset.label_to_category_id == {0: 1, 1: 2}
    assert dataset[0][1].labels.tolist() == [1]


def test_parent_with_annotations_and_self_named_supercategory_are_kept(tmp_path):
    cats = categories((0, "animals", "none"), (1, "cat", "animals"), (2, "person", "person"))
    path = coco_file(tmp_path, [annotation(0, [1, 1, 5, 5], category_id=0)], cats)
    assert CocoDetection(path, tmp_path, EVAL).class_names == ["animals", "cat", "person"]


def test_box_comes_out_as_normalised_cxcywh_after_eval_resize(roboflow_dir):
    dataset = CocoDetection(roboflow_dir / "train/_annotations.coco.json", roboflow_dir / "train", EVAL)
    pixels, target = dataset[0]
    assert pixels.shape == (3, 64, 64) and pixels.dtype == torch.float32
    # bbox [20, 10, 60, 40] in a 200x100 image; the crowd dog is left out of the target
    torch.testing.assert_close(target.boxes, torch.tensor([[0.25, 0.3, 0.3, 0.4]]))
    assert target.labels.tolist() == [0] and target.labels.dtype == torch.int64
    assert target.orig_size == (100, 200) and target.size == (64, 64)
    assert target.area.tolist() == [2400.0]


def test_horizontal_flip_mirrors_box_and_pixels(roboflow_dir):
    files = (roboflow_dir / "train/_annotations.coco.json", roboflow_dir / "train")
    flipped = CocoDetection(*files, build_train_transform([64], scale_jitter=False, flip_p=1.0))[0]
    plain = CocoDetection(*files, build_train_transform([64], scale_jitter=False, flip_p=0.0))[0]
    torch.testing.assert_close(flipped[1].boxes, torch.tensor([[0.75, 0.3, 0.3, 0.4]]))
    torch.testing.assert_close(flipped[0], plain[0].flip(-1))


def test_crowd_regions_reach_the_target_in_source_pixels_whatever_the_transform(roboflow_dir):
    files = (roboflow_dir / "train/_annotations.coco.json", roboflow_dir / "train")
    for transform in (EVAL, build_train_transform([48], scale_jitter=False, flip_p=1.0)):
        target = CocoDetection(*files, transform)[0][1]
        # the crowd dog [100, 50, 50, 30] (xywh) of the 200x100 image, untouched by resize and flip
        torch.testing.assert_close(target.crowd_boxes, torch.tensor([[100.0, 50.0, 150.0, 80.0]]))
        assert target.crowd_labels.tolist() == [1] and target.labels.tolist() == [0]
    valid = CocoDetection(roboflow_dir / "valid/_annotations.coco.json", roboflow_dir / "valid", EVAL)[0][1]
    assert valid.crowd_boxes.shape == (0, 4) and valid.crowd_labels.dtype == torch.int64
    moved = target.to("cpu")
    assert torch.equal(moved.crowd_boxes, target.crowd_boxes) and torch.equal(moved.crowd_labels, target.crowd_labels)


def test_annotation_area_is_kept_and_missing_area_is_box_area(tmp_path):
    path = coco_file(tmp_path, [annotation(0, [0, 0, 10, 20], area=123.0), annotation(1, [50, 50, 10, 4])])
    assert CocoDetection(path, tmp_path, EVAL)[0][1].area.tolist() == [123.0, 40.0]


def test_images_without_annotations_are_background(tmp_path):
    images = [{"id": 1, "file_name": "a.png", "width": 200, "height": 100},
              {"id": 5, "file_name": "b.png", "width": 40, "height": 30}]
    dataset = CocoDetection(coco_file(tmp_path, [annotation(0, [1, 1, 5, 5])], images=images), tmp_path, EVAL)
    assert len(dataset) == 2
    _, target = dataset[1]
    assert target.image_id == 5 and target.boxes.shape == (0, 4) and target.labels.shape == (0,)


def test_valid_split_reuses_train_mapping(roboflow_dir):
    # valid lists the categories in another order and adds one train does not have
    cats = categories((2, "dog", "animal"), (1, "cat", "animal"), (9, "cow", "animal"))
    coco_file(roboflow_dir / "valid", [annotation(0, [0, 0, 10, 10], category_id=2)], cats)
    train, valid, test = roboflow_splits(roboflow_dir, EVAL, EVAL)
    assert valid.class_names == train.class_names == ["cat", "dog"]
    assert valid[0][1].labels.tolist() == [1] and test is None


def test_coco2017_layout_remaps_sparse_ids_to_contiguous_labels(tmp_path):
    cats = categories((1, "person", "person"), (3, "car", "vehicle"), (7, "train", "vehicle"))
    for split in ("train2017", "val2017"):
        coco_file(tmp_path / split, [annotation(0, [1, 1, 5, 5], category_id=7)], cats)
        (tmp_path / "annotations").mkdir(exist_ok=True)
        (tmp_path / split / "_annotations.coco.json").rename(tmp_path / f"annotations/instances_{split}.json")
    train, valid, test = coco2017_splits(tmp_path, EVAL, EVAL)
    assert train.class_names == ["person", "car", "train"] and test is None
    assert train.label_to_category_id == {0: 1, 1: 3, 2: 7}
    assert valid[0][1].labels.tolist() == [2]


def test_coco_ground_truth_is_in_label_space_with_crowd_and_pixel_boxes(roboflow_dir):
    truth = CocoDetection(roboflow_dir / "train/_annotations.coco.json", roboflow_dir / "train", EVAL)
    assert truth.coco_ground_truth() == {
        "images": [{"id": 1, "file_name": "a.png", "width": 200, "height": 100}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 0, "bbox": [20.0, 10.0, 60.0, 40.0], "area": 2400.0, "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [100.0, 50.0, 50.0, 30.0], "area": 1500.0, "iscrowd": 1},
        ],
        "categories": [{"id": 0, "name": "cat", "supercategory": "none"},
                       {"id": 1, "name": "dog", "supercategory": "none"}],
    }


def test_ground_truth_scores_perfect_detections_as_map_one(roboflow_dir):
    coco_api = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    truth = CocoDetection(roboflow_dir / "valid/_annotations.coco.json", roboflow_dir / "valid", EVAL,
                          CocoDetection(roboflow_dir / "train/_annotations.coco.json", roboflow_dir / "train",
                                        EVAL).categories).coco_ground_truth()
    gt = coco_api.COCO()
    gt.dataset = truth
    gt.createIndex()
    detections = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
                  for a in truth["annotations"]]
    evaluator = cocoeval.COCOeval(gt, gt.loadRes(detections), "bbox")
    evaluator.evaluate(), evaluator.accumulate(), evaluator.summarize()
    assert evaluator.stats[0] == pytest.approx(1.0)


def test_degenerate_boxes_are_dropped_with_one_warning(tmp_path):
    path = coco_file(tmp_path, [annotation(0, [10, 10, 0, 5]), annotation(1, [250, 10, 5, 5]),
                                annotation(2, [10, 10, 5, 5])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = CocoDetection(path, tmp_path, EVAL)
    assert len(caught) == 1 and "dropped 2 degenerate boxes" in str(caught[0].message)
    assert str(path) in str(caught[0].message)
    assert len(dataset[0][1].boxes) == 1


def test_invalid_json_names_file_and_position(tmp_path):
    coco_file(tmp_path, [])
    path = tmp_path / "_annotations.coco.json"
    path.write_text('{"images": [}')
    with pytest.raises(ValueError, match="line 1 column 13") as error:
        CocoDetection(path, tmp_path, EVAL)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("field, value", [("category_id", 99), ("image_id", 42)])
def test_annotation_with_unknown_reference_names_file_id_and_value(tmp_path, field, value):
    path = coco_file(tmp_path, [annotation(7, [1, 1, 5, 5], **{field: value})])
    with pytest.raises(ValueError, match=f"annotation 7 has {field} {value}") as error:
        CocoDetection(path, tmp_path, EVAL)
    assert str(path) in str(error.value)


def test_missing_image_file_is_named(tmp_path):
    path = coco_file(tmp_path, [])
    data = json.loads(path.read_text())
    data["images"].append({"id": 2, "file_name": "gone.jpg", "width": 10, "height": 10})
    path.write_text(json.dumps(data))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "gone.jpg"))):
        CocoDetection(path, tmp_path, EVAL)


def test_missing_annotation_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "none.json"))):
        CocoDetection(tmp_path / "none.json", tmp_path, EVAL)


def test_undecodable_image_error_names_file_through_dataloader_worker(tmp_path):
    path = coco_file(tmp_path, [annotation(0, [1, 1, 5, 5])])
    (tmp_path / "a.png").write_bytes(b"not an image at all")
    loader = torch.utils.data.DataLoader(CocoDetection(path, tmp_path, EVAL), num_workers=1,
                                         collate_fn=lambda samples: samples)
    batches = iter(loader)
    with pytest.raises(ValueError, match="cannot decode image") as error:
        next(batches)
    batches._shutdown_workers()  # torch's finalizer would wait 5 s for the worker that raised
    assert str(tmp_path / "a.png") in str(error.value)
