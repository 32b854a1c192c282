"""The torch Dataset every format shares: parsed annotation records in, (pixels, Target) out."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors

from detrkit.datasets import keypoints as kp
from detrkit.datasets.images import read_image, to_tensor
from detrkit.datasets.keypoint_schema import KeypointSchema
from detrkit.datasets.loading_slots import LoadingSlots
from detrkit.datasets.segments import decode_masks
from detrkit.ops.boxes import xyxy_to_cxcywh
from detrkit.structures import Target

# (image, {"boxes", "labels", "area"[, "masks"][, "keypoints", "keypoint_visibility"]}) -> (normalised
# float image, same keys), e.g. a v2.Compose; "masks" is a tv_tensors.Mask (N, H, W) bool, present when
# the data set has masks; keypoints are tv_tensors.KeyPoints (N, K, 2) pixels with a kp.Visibility (N, K)
SampleTransform = Callable[[tv_tensors.Image, dict[str, Any]], tuple[torch.Tensor, dict[str, Any]]]


class SampleLoadError(ValueError):
    """One sample could not be read or transformed (its image deleted, truncated or unreadable, a
    transform failing on it); the message names the sample's index, image id and file. Takes one
    message, so that a DataLoader worker can re-raise it as itself in the main process."""


@dataclass
class ImageRecord:
    """One image's annotations as read from disk, crowd regions included.

    boxes (N, 4) float32 xyxy normalised by the image size and clamped to [0, 1]; labels (N,)
    int64; iscrowd (N,) bool; area (N,) source pixels, or None for "box area"; size (H, W) when
    the annotation file states it, else None (read from the image header when needed).
    mask_rles: one compressed COCO RLE string per row at `size` (which is then set), or None
    when the data set is read without masks. keypoints (N, K, 3) float32: x, y normalised like
    the boxes and visibility v in {0, 1, 2}, all zero where v = 0; None without keypoints.
    """

    path: Path
    image_id: int
    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray | None = None
    size: tuple[int, int] | None = None
    mask_rles: list[bytes] | None = None
    keypoints: np.ndarray | None = None


class DetectionDataset(Dataset):
    """Decodes record images, applies `transform` to pixels and boxes, returns (pixels, Target).

    Crowd regions stay out of the transformed boxes; every split's Target carries them apart,
    in source pixels, for evaluation. Records with masks give samples with masks, decoded here
    for this sample only and transformed with their boxes; records with keypoints give samples
    with keypoints (`keypoint_schema` says their layout), likewise.

    An image that cannot be read when its sample is asked for (deleted or cut after the up-front
    check) raises an error naming it; with `skip_unreadable` (set from skip_bad_images) the next
    readable image stands in for it, with a warning.
    """

    skip_unreadable: bool = False
    # the sample each loader worker is loading, so that one killed by a signal can be named (worker_deaths.py)
    slots: LoadingSlots = LoadingSlots()

    def __init__(self, records: list[ImageRecord], class_names: list[str], transform: SampleTransform,
                 label_to_category_id: dict[int, int] | None = None,
                 keypoint_schema: KeypointSchema | None = None) -> None:
        self.records = records
        self.keypoint_schema = keypoint_schema
        self.class_names = list(class_names)
        self.transform = transform
        # the data set's own category id behind each label (identity where labels are the ids)
        self.label_to_category_id = label_to_category_id or {i: i for i in range(len(class_names))}

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        try:
            with self.slots.loading(index):
                return self._sample(index)
        except Exception as error:  # in a loader worker too: the message travels, naming the sample
            raise SampleLoadError(f"{self.sample_name(index)} failed to load: {type(error).__name__}: "
                                  f"{error}") from error

    def sample_name(self, index: int) -> str:
        """How errors name sample `index`: 'data set sample 3 (image id 7, file .../x.jpg)'."""
        record = self.records[index]
        return f"data set sample {index} (image id {record.image_id}, file {record.path})"

    def _sample(self, index: int) -> tuple[torch.Tensor, Target]:
        record, image = self._readable(index)
        image = tv_tensors.Image(to_tensor(image))
        height, width = image.shape[-2:]
        keep = ~record.iscrowd
        scale = torch.tensor([width, height, width, height])
        boxes = torch.from_numpy(record.boxes[keep]) * scale
        area = _box_area(boxes) if record.area is None else torch.from_numpy(record.area[keep])
        sample = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
            "labels": torch.from_numpy(record.labels[keep]),
            "area": area,
        }
        if record.mask_rles is not None:
            sample["masks"] = tv_tensors.Mask(_decode_kept(record, keep, (height, width)))
        if record.keypoints is not None:
            sample.update(kp.to_sample(torch.from_numpy(record.keypoints[keep]), (height, width)))
        pixels, sample = self.transform(image, sample)
        target = _to_target(sample, record.image_id, (height, width), tuple(pixels.shape[-2:]))
        # crowd regions skip the transform: evaluation reads them in source pixels
        target.crowd_boxes = torch.from_numpy(record.boxes[record.iscrowd]) * scale
        target.crowd_labels = torch.from_numpy(record.labels[record.iscrowd])
        return pixels.as_subclass(torch.Tensor), target

    def _readable(self, index: int) -> tuple[ImageRecord, Image.Image]:
        """The record at `index` and its decoded image; with skip_unreadable, the first readable one from there."""
        for offset in range(len(self.records)):
            record = self.records[(index + offset) % len(self.records)]
            try:
                return record, read_image(record.path)
            except (FileNotFoundError, ValueError) as error:
                if not self.skip_unreadable:
                    raise type(error)(f"{error} (image id {record.image_id}, read for its sample; skip_bad_images=True "
                                      f"trains past images that break after the up-front check)") from error
                warnings.warn(f"skip_bad_images=True: {error}; the next readable image stands in for it",
                              stacklevel=2)
        raise ValueError(f"none of the {len(self.records)} images of this split can be read any more")

    def coco_ground_truth(self) -> dict:
        """COCO-format {images, annotations, categories} in label space (category_id = label),
        boxes xywh in source pixels, crowd regions included; annotation ids count from 1. Data
        read with masks add each annotation's `segmentation` as compressed RLE; with keypoints, its
        `keypoints` (pixels) and `num_keypoints`, and each category its keypoint names and skeleton."""
        images, annotations = [], []
        for record in self.records:
            height, width = record.size or header_size(record.path)
            images.append({"id": record.image_id, "file_name": record.path.name, "width": width, "height": height})
            annotations += _record_annotations(record, (height, width), len(annotations) + 1)
        categories = [{"id": label, "name": name, "supercategory": "none"}
                      for label, name in enumerate(self.class_names)]
        if self.keypoint_schema is not None:
            for label, category in enumerate(categories):
                category.update(self.keypoint_schema.coco_fields(label))
        return {"images": images, "annotations": annotations, "categories": categories}


def _record_annotations(record: ImageRecord, size: tuple[int, int], first_id: int) -> list[dict]:
    height, width = size
    boxes = record.boxes * np.array([width, height, width, height], dtype=np.float32)
    area = record.area if record.area is not None else _box_area(torch.from_numpy(boxes)).numpy()
    annotations = []
    for row, (box, label, crowd, box_area) in enumerate(zip(boxes.tolist(), record.labels.tolist(),
                                                            record.iscrowd.tolist(), area.tolist())):
        annotation = {"id": first_id + row, "image_id": record.image_id, "category_id": label,
                      "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]], "area": box_area,
                      "iscrowd": int(crowd)}
        if record.mask_rles is not None:  # str counts keep it JSON-safe; pycocotools reads both
            annotation["segmentation"] = {"size": [height, width], "counts": record.mask_rles[row].decode("ascii")}
        if record.keypoints is not None:
            points = record.keypoints[row] * np.array([width, height, 1], dtype=np.float32)  # (K, 3) pixels
            annotation["keypoints"] = points.ravel().tolist()
            annotation["num_keypoints"] = int((points[:, 2] > 0).sum())
        annotations.append(annotation)
    return annotations


def _box_area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def _decode_kept(record: ImageRecord, keep: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """(N, H, W) bool masks of the non-crowd rows; the image must have the size the masks were read at."""
    rows = np.flatnonzero(keep)
    if len(rows) and record.size != size:
        raise ValueError(f"image {record.path} is {size[1]}x{size[0]} (WxH) but its annotations give "
                         f"{record.size[1]}x{record.size[0]}; its masks would not line up with it")
    return decode_masks([record.mask_rles[row] for row in rows], size)


def _to_target(sample: dict[str, Any], image_id: int, orig_size: tuple[int, int],
               size: tuple[int, int]) -> Target:
    """Drop boxes a crop emptied, with their masks and keypoints; xyxy pixels -> cxcywh normalised by
    the output size, keypoints too."""
    boxes = sample["boxes"].as_subclass(torch.Tensor)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    height, width = size
    scale = torch.tensor([width, height, width, height], dtype=boxes.dtype)
    masks = sample.get("masks")
    return Target(boxes=xyxy_to_cxcywh(boxes[keep]) / scale, labels=sample["labels"][keep],
                  image_id=image_id, orig_size=orig_size, size=size, area=sample["area"][keep],
                  masks=None if masks is None else masks.as_subclass(torch.Tensor)[keep].bool(),
                  keypoints=kp.to_target(sample, keep, size) if kp.KEYPOINTS in sample else None)


def header_size(path: Path) -> tuple[int, int]:
    """(H, W) from the image header without decoding the pixels."""
    try:
        with Image.open(path) as image:
            return image.height, image.width
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"cannot read the size of image {path}: {error}") from error
