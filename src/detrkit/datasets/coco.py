"""Read COCO-format annotation files (Roboflow export or COCO 2017 layout) into detection datasets."""

from __future__ import annotations

import json
import os
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detrkit.datasets import segments
from detrkit.datasets.coco_keypoints import (
    UNUSED_SLOT,
    annotation_keypoints,
    category_keypoints,
    keypoint_layout,
)
from detrkit.datasets.detection import DetectionDataset, ImageRecord, SampleTransform
from detrkit.datasets.image_check import ImageScreen
from detrkit.datasets.keypoint_schema import KeypointSchema

ROBOFLOW_ANNOTATIONS = "_annotations.coco.json"
ROBOFLOW_SPLITS = ("train", "valid", "test")
COCO_SPLITS = {"train": "train2017", "valid": "val2017"}  # our split name -> COCO folder


@dataclass(frozen=True)
class CategoryMap:
    """Label i stands for the data set's category `category_ids[i]`, named `names[i]`."""

    category_ids: tuple[int, ...]
    names: tuple[str, ...]


class CocoDetection(DetectionDataset):
    """One split of a COCO-format data set; labels 0..N-1 index the kept categories. With
    `masks`, every annotation's `segmentation` is checked and kept as compressed RLE. With
    `keypoints` (the model's num_keypoints_per_class; empty: as the data says), categories take
    the label slots of the keypoint schema and every annotation's keypoints are checked and kept;
    other splits pass the first split's `categories` and `keypoint_schema` instead. A `screen`
    checks the image files (a missing one is then its to report) and the bad ones are left out."""

    def __init__(self, annotation_file: str | os.PathLike, image_dir: str | os.PathLike,
                 transform: SampleTransform, categories: CategoryMap | None = None, masks: bool = False,
                 keypoints: Sequence[int] | None = None, keypoint_schema: KeypointSchema | None = None,
                 screen: ImageScreen | None = None) -> None:
        annotation_file = Path(annotation_file)
        data = load_coco_json(annotation_file)
        self.categories = categories or category_map(data, annotation_file)
        if keypoints is not None and keypoint_schema is None:
            ids, names, keypoint_schema = keypoint_layout(data, annotation_file, self.categories.category_ids,
                                                          self.categories.names, keypoints)
            self.categories = CategoryMap(tuple(ids), tuple(names))
        counts = None
        if keypoint_schema is not None:
            known = [c for c in self.categories.category_ids if c != UNUSED_SLOT]
            counts = {c: k.count for c, k in category_keypoints(data, annotation_file, known).items()}
        records = _read_records(data, annotation_file, Path(image_dir), self.categories, masks,
                                (keypoint_schema.width, counts) if counts is not None else None, screen)
        super().__init__(records, list(self.categories.names), transform,
                         dict(enumerate(self.categories.category_ids)), keypoint_schema)


def load_coco_json(path: Path) -> dict:
    """The parsed file; errors name the file (and the position of a JSON syntax error)."""
    if not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON in {path}: {error.msg} at line {error.lineno} column "
                         f"{error.colno} (char {error.pos})") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: {error}") from error
    missing = [key for key in ("images", "annotations", "categories")
               if not isinstance(data, dict) or not isinstance(data.get(key), list)]
    if missing:
        raise ValueError(f"{path} is not a COCO detection file: missing list(s) {missing}")
    return data


def category_map(data: dict, path: Path) -> CategoryMap:
    """Categories sorted by id, minus "parent" categories: named as another category's
    supercategory (not its own name) and without annotations, like Roboflow's root class."""
    for category in data["categories"]:
        if not isinstance(category, dict) or not isinstance(category.get("id"), int) or "name" not in category:
            raise ValueError(f"{path}: category {category!r} needs an integer 'id' and a 'name'")
    categories = sorted(data["categories"], key=lambda c: c["id"])
    used = {annotation.get("category_id") for annotation in data["annotations"]}
    parents = {c.get("supercategory") for c in categories if c.get("supercategory") != c["name"]}
    kept = [c for c in categories if c["name"] not in parents or c["id"] in used]
    if not kept:
        raise ValueError(f"{path} defines no categories")
    return CategoryMap(tuple(c["id"] for c in kept), tuple(str(c["name"]) for c in kept))


def roboflow_splits(root: Path, train_transform: SampleTransform, eval_transform: SampleTransform,
                    masks: bool = False, keypoints: Sequence[int] | None = None, screen: ImageScreen | None = None,
                    ) -> tuple[CocoDetection, CocoDetection, CocoDetection | None]:
    """`root/{train,valid,test}/_annotations.coco.json` with images beside; test is optional."""
    train = CocoDetection(root / "train" / ROBOFLOW_ANNOTATIONS, root / "train", train_transform, None, masks,
                          keypoints, screen=screen)

    def split(name: str) -> CocoDetection:
        return CocoDetection(root / name / ROBOFLOW_ANNOTATIONS, root / name, eval_transform, train.categories,
                             masks, keypoint_schema=train.keypoint_schema, screen=screen)

    test = split("test") if (root / "test" / ROBOFLOW_ANNOTATIONS).exists() else None
    return train, split("valid"), test


def coco2017_splits(root: Path, train_transform: SampleTransform, eval_transform: SampleTransform,
                    masks: bool = False, keypoints: Sequence[int] | None = None, screen: ImageScreen | None = None,
                    ) -> tuple[CocoDetection, CocoDetection, None]:
    """`root/annotations/instances_{train,val}2017.json` with images in `root/{train,val}2017`;
    keypoint models read `person_keypoints_{train,val}2017.json` instead."""
    prefix = "instances" if keypoints is None else "person_keypoints"

    def file(name: str) -> Path:
        return root / "annotations" / f"{prefix}_{COCO_SPLITS[name]}.json"

    train = CocoDetection(file("train"), root / COCO_SPLITS["train"], train_transform, None, masks, keypoints,
                          screen=screen)
    valid = CocoDetection(file("valid"), root / COCO_SPLITS["valid"], eval_transform, train.categories, masks,
                          keypoint_schema=train.keypoint_schema, screen=screen)
    return train, valid, None


Row = tuple[list[float], int, float, bool, "bytes | None", "np.ndarray | None"]


def _read_records(data: dict, path: Path, image_dir: Path, categories: CategoryMap, masks: bool,
                  keypoints: tuple[int, dict[int, int]] | None, screen: ImageScreen | None) -> list[ImageRecord]:
    """The images' records; `keypoints` = (width, keypoint count per category id) reads them too.
    Images the `screen` finds bad get no record (their annotations are still checked)."""
    sizes, files = _index_images(data, path, image_dir, require_files=screen is None)
    if screen is not None:
        bad = screen(path.parent, path.name, [(files[i], sizes[i]) for i in files])
        files = {i: file for i, file in files.items() if file not in bad}
    label_of = {category_id: label for label, category_id in enumerate(categories.category_ids)}
    rows: dict[int, list[Row]] = defaultdict(list)
    degenerate = 0
    for annotation in data["annotations"]:
        image_id, label = _check_annotation(annotation, path, sizes, label_of)
        height, width = sizes[image_id]
        rle = _mask_rle(annotation, path, (height, width)) if masks else None  # checked even if dropped below
        points = None
        if keypoints is not None:
            points = annotation_keypoints(annotation, path, keypoints[1].get(annotation["category_id"], 0),
                                          keypoints[0], (height, width))
        x, y, w, h = (float(v) for v in annotation["bbox"])
        box = [min(max(x, 0.0), width), min(max(y, 0.0), height),
               min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)]
        if box[2] <= box[0] or box[3] <= box[1]:
            degenerate += 1
            continue
        area = float(annotation.get("area", (box[2] - box[0]) * (box[3] - box[1])))
        normalised = [box[0] / width, box[1] / height, box[2] / width, box[3] / height]
        rows[image_id].append((normalised, label, area, bool(annotation.get("iscrowd", 0)), rle, points))
    if degenerate:
        warnings.warn(f"dropped {degenerate} degenerate boxes (width or height <= 0 after clamping to "
                      f"the image) in {path}", stacklevel=3)
    width = None if keypoints is None else keypoints[0]
    records = [_record(files[i], i, sizes[i], rows[i], masks, width) for i in files]
    if masks:
        _warn_empty_masks(records, path)
    return records


def _mask_rle(annotation: dict, path: Path, size: tuple[int, int]) -> bytes:
    where = f"{path}: annotation {annotation.get('id')}"
    return segments.encode_segmentation(annotation.get("segmentation"), size, where)


def _warn_empty_masks(records: list[ImageRecord], path: Path) -> None:
    """One warning counting the (non-crowd) boxes whose mask covers no pixel."""
    empty = total = 0
    for record in records:
        kept = [rle for rle, crowd in zip(record.mask_rles, record.iscrowd) if not crowd]
        empty += int((segments.mask_areas(kept, record.size) == 0).sum())
        total += len(kept)
    segments.warn_empty(empty, total, str(path))


def _index_images(data: dict, path: Path, image_dir: Path, require_files: bool = True,
                  ) -> tuple[dict[int, tuple[int, int]], dict[int, Path]]:
    """image id -> (H, W) and -> file; with `require_files`, every listed file must exist."""
    sizes, files = {}, {}
    for image in data["images"]:
        image_id = image.get("id") if isinstance(image, dict) else None
        if not isinstance(image_id, int):
            raise ValueError(f"{path}: image entry {image!r} has no integer 'id'")
        width, height, name = image.get("width"), image.get("height"), image.get("file_name")
        if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0 and name):
            raise ValueError(f"{path}: image {image_id} needs 'file_name' and positive integer "
                             f"'width' and 'height', got {name!r}, {width!r}, {height!r}")
        file = image_dir / name
        if require_files and not os.path.exists(file):
            raise FileNotFoundError(f"image file {file} (image id {image_id} in {path}) does not exist")
        sizes[image_id], files[image_id] = (height, width), file
    return sizes, files


def _check_annotation(annotation: dict, path: Path, sizes: dict, label_of: dict[int, int]) -> tuple[int, int]:
    """(image id, label) of a well-formed annotation; errors name the file and annotation id."""
    ident = annotation.get("id") if isinstance(annotation, dict) else annotation
    if not isinstance(annotation, dict):
        raise ValueError(f"{path}: annotation {ident!r} is not an object")
    image_id, category_id = annotation.get("image_id"), annotation.get("category_id")
    if not isinstance(image_id, int) or image_id not in sizes:
        raise ValueError(f"{path}: annotation {ident} has image_id {image_id!r}, which is not among the images")
    if not isinstance(category_id, int) or category_id not in label_of:
        raise ValueError(f"{path}: annotation {ident} has category_id {category_id!r}, which is not one of "
                         f"the known category ids {sorted(label_of)}")
    bbox = annotation.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
        raise ValueError(f"{path}: annotation {ident} has bbox {bbox!r}; expected [x, y, width, height]")
    return image_id, label_of[category_id]


def _record(file: Path, image_id: int, size: tuple[int, int], rows: list[Row], masks: bool,
            keypoint_width: int | None) -> ImageRecord:
    boxes, labels, area, crowd, rles, points = zip(*rows) if rows else ((), (), (), (), (), ())
    return ImageRecord(
        path=file, image_id=image_id, size=size,
        boxes=np.array(boxes, dtype=np.float32).reshape(-1, 4),
        labels=np.array(labels, dtype=np.int64),
        iscrowd=np.array(crowd, dtype=bool),
        area=np.array(area, dtype=np.float32),
        mask_rles=list(rles) if masks else None,
        keypoints=None if keypoint_width is None else np.array(points, dtype=np.float32).reshape(-1, keypoint_width, 3),
    )
