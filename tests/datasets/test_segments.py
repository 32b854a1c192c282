"""Instance masks from annotation files: COCO polygons and RLE, YOLO polygons; their checks, their
compact storage and their decoding per sample."""

from __future__ import annotations

import warnings
from itertools import pairwise

import numpy as np
import pytest
import torch
from tiny_data import annotation, coco_file, write_image

from detrkit.datasets import segments
from detrkit.datasets.coco import CocoDetection
from detrkit.datasets.transforms import build_eval_transform
from detrkit.datasets.yolo import YoloDetection

mask_api = pytest.importorskip("pycocotools.mask")

SIZE = (100, 200)  # (H, W) of tiny_data's default image
SQUARE = [20.0, 10.0, 60.0, 10.0, 60.0, 40.0, 20.0, 40.0]  # pixels x 20..59, y 10..39


def box_mask(x0: int, y0: int, x1: int, y1: int, size=SIZE) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[y0:y1, x0:x1] = True
    return mask


def decoded(segmentation, size=SIZE) -> torch.Tensor:
    return segments.decode_masks([segments.encode_segmentation(segmentation, size, "test")], size)[0]


def uncompressed(mask: torch.Tensor) -> list[int]:
    """Run lengths of a mask in COCO's column-major order, starting with a run of zeros."""
    flat = mask.T.flatten().to(torch.int8)
    changes = torch.nonzero(flat[1:] != flat[:-1])[:, 0] + 1
    edges = [0, *changes.tolist(), len(flat)]
    runs = [b - a for a, b in pairwise(edges)]
    return runs if not flat[0] else [0, *runs]


def test_polygon_parts_are_ored_and_fill_coco_pixels():
    second = [100.0, 50.0, 120.0, 50.0, 120.0, 60.0, 100.0, 60.0]
    assert torch.equal(decoded([SQUARE]), box_mask(20, 10, 60, 40))
    assert torch.equal(decoded([SQUARE, second]), box_mask(20, 10, 60, 40) | box_mask(100, 50, 120, 60))


def test_rle_compressed_str_and_bytes_and_uncompressed_decode_the_same():
    mask = box_mask(5, 7, 30, 9) | box_mask(150, 80, 199, 100)
    counts = uncompressed(mask)
    compressed = mask_api.frPyObjects({"size": list(SIZE), "counts": counts}, *SIZE)["counts"]
    for rle in ({"size": list(SIZE), "counts": counts}, {"size": list(SIZE), "counts": compressed},
                {"size": list(SIZE), "counts": compressed.decode("ascii")}):
        assert torch.equal(decoded(rle), mask)


def test_compressed_total_reads_what_pycocotools_writes():
    rng = np.random.default_rng(0)
    for _ in range(20):
        height, width = (int(v) for v in rng.integers(1, 60, 2))
        mask = rng.random((height, width)) < rng.uniform(0.05, 0.95)
        counts = mask_api.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"]
        assert segments.compressed_total(counts, "test") == height * width


def test_missing_or_empty_segmentation_is_an_all_zero_mask():
    for segmentation in (None, []):
        assert not decoded(segmentation).any() and decoded(segmentation).shape == SIZE


@pytest.mark.parametrize("segmentation, message", [
    ([[1.0, 2.0, 3.0, 4.0]], "has 2 point"),
    ([[1.0, 2.0, 3.0, 4.0, 5.0]], "even-length"),
    ([[10.0, 10.0, 50.0, 10.0, 30.0, 102.5]], "outside the 200x100 image"),
    ([[-1.5, 10.0, 50.0, 10.0, 30.0, 40.0]], "outside the 200x100 image"),
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "list of polygons"),
    ({"size": [50, 200], "counts": [20000]}, r"RLE size \[50, 200\] disagrees"),
    ({"size": [100, 200], "counts": [100, 5]}, "cover 105 pixels"),
    ({"size": [100, 200], "counts": "0"}, "cover 0 pixels"),
    ({"size": [100, 200], "counts": "a~"}, "invalid character"),
    ({"size": [100, 200], "counts": 12}, "counts must be"),
])
def test_bad_segmentations_raise_naming_where(segmentation, message):
    with pytest.raises(ValueError, match=message) as error:
        segments.encode_segmentation(segmentation, SIZE, "file.json: annotation 7")
    assert str(error.value).startswith("file.json: annotation 7")


def test_vertices_within_a_pixel_outside_are_accepted():
    assert decoded([[-1.0, -0.5, 200.9, 0.0, 201.0, 101.0]]).any()


def coco_with_masks(tmp_path, annotations, **kwargs):
    folder = tmp_path / "train"
    coco_file(folder, annotations)
    return CocoDetection(folder / "_annotations.coco.json", folder, build_eval_transform(50, square=False),
                         **kwargs)


def test_coco_reader_keeps_rle_and_decodes_per_sample(tmp_path):
    crowd = {"size": list(SIZE), "counts": uncompressed(box_mask(100, 50, 150, 80))}
    dataset = coco_with_masks(tmp_path, [annotation(0, [20, 10, 40, 30], segmentation=[SQUARE]),
                                         annotation(1, [100, 50, 50, 30], iscrowd=1, segmentation=crowd)],
                              masks=True)
    record = dataset.records[0]
    assert all(isinstance(rle, bytes) for rle in record.mask_rles) and len(record.mask_rles) == 2
    _, target = dataset[0]
    assert target.masks.dtype == torch.bool and target.masks.shape == (1, *target.size)  # crowd left out
    assert target.size == (50, 100)
    assert torch.equal(target.masks[0], box_mask(10, 5, 30, 20, size=(50, 100)))
    truth = dataset.coco_ground_truth()["annotations"]
    assert [mask_api.area(a["segmentation"]) for a in truth] == [1200, 1500]


def test_coco_reader_without_masks_ignores_segmentations(tmp_path):
    dataset = coco_with_masks(tmp_path, [annotation(0, [20, 10, 40, 30], segmentation=[[1, 2, 3, 4]])])
    assert dataset.records[0].mask_rles is None and dataset[0][1].masks is None
    assert "segmentation" not in dataset.coco_ground_truth()["annotations"][0]


def test_coco_errors_name_the_file_and_annotation(tmp_path):
    with pytest.raises(ValueError, match=r"_annotations.coco.json: annotation 42: .*has 2 point"):
        coco_with_masks(tmp_path, [annotation(42, [20, 10, 40, 30], segmentation=[[1, 2, 3, 4]])], masks=True)
    with pytest.raises(ValueError, match=r"annotation 43: RLE size \[10, 10\] disagrees"):
        coco_with_masks(tmp_path, [annotation(43, [2, 2, 4, 4], segmentation={"size": [10, 10], "counts": [100]})],
                        masks=True)


def test_empty_masks_warn_once_with_a_count(tmp_path):
    annotations = [annotation(0, [20, 10, 40, 30], segmentation=[SQUARE]), annotation(1, [50, 50, 10, 10]),
                   annotation(2, [60, 60, 10, 10], segmentation=[[70, 70, 70.2, 70, 70.1, 70.2]])]
    with pytest.warns(UserWarning, match="2 of 3 boxes .* have an empty mask") as caught:
        dataset = coco_with_masks(tmp_path, annotations, masks=True)
    assert len([w for w in caught if "empty mask" in str(w.message)]) == 1
    assert dataset[0][1].masks.sum((1, 2)).tolist()[1:] == [0, 0]


def test_image_of_another_size_than_annotated_is_an_error(tmp_path):
    dataset = coco_with_masks(tmp_path, [annotation(0, [20, 10, 40, 30], segmentation=[SQUARE])], masks=True)
    write_image(tmp_path / "train" / "a.png", 120, 100)
    with pytest.raises(ValueError, match=r"a.png is 120x100 .* annotations give 200x100"):
        dataset[0]


def yolo_images(tmp_path, labels: str):
    image = write_image(tmp_path / "train" / "images" / "a.png", 100, 50)
    (tmp_path / "train" / "labels").mkdir()
    (tmp_path / "train" / "labels" / "a.txt").write_text(labels)
    background = write_image(tmp_path / "train" / "images" / "b.png", 100, 50, seed=1)
    return [image, background]


def test_yolo_polygons_and_boxes_become_masks(tmp_path):
    images = yolo_images(tmp_path, "0 0.5 0.5 0.2 0.4\n1 0.1 0.2 0.3 0.2 0.3 0.6 0.1 0.6\n")
    dataset = YoloDetection(images, ["cat", "dog"], build_eval_transform(50, square=False), masks=True)
    _, target = dataset[0]
    assert target.size == (50, 100)
    assert torch.equal(target.masks[0], box_mask(40, 15, 60, 35, size=(50, 100)))
    assert torch.equal(target.masks[1], box_mask(10, 10, 30, 30, size=(50, 100)))
    assert dataset[1][1].masks.shape == (0, 50, 100)  # background image
    plain = YoloDetection(images, ["cat", "dog"], build_eval_transform(50, square=False))
    assert plain[0][1].masks is None and np.array_equal(plain.records[0].boxes, dataset.records[0].boxes)


def test_yolo_polygon_outside_the_image_names_the_label_file_and_line(tmp_path):
    images = yolo_images(tmp_path, "0 0.5 0.5 0.2 0.4\n1 0.1 0.2 1.03 0.2 0.3 0.6\n")
    with pytest.raises(ValueError, match=r"label file .*a.txt line 2: the polygon .* outside the 100x50"):
        YoloDetection(images, ["cat", "dog"], build_eval_transform(50), masks=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        YoloDetection(images, ["cat", "dog"], build_eval_transform(50))  # detection clamps, as before
