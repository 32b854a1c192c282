"""Counts of a split's ground truth: instances per class, COCO box sizes, images without boxes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# COCO's size ranges: small below 32², medium below 96², large from there (areas in pixels)
SMALL_AREA, LARGE_AREA = 32.0**2, 96.0**2


@dataclass(frozen=True)
class DatasetStats:
    """What one split's ground truth holds (crowd regions left out)."""

    images: int
    instances_per_class: dict[str, int]  # every class, 0 where it has no instance
    small: int
    medium: int
    large: int
    images_without_boxes: int

    @property
    def instances(self) -> int:
        return sum(self.instances_per_class.values())


def dataset_stats(truth: Sequence[dict[str, torch.Tensor]], class_names: Sequence[str]) -> DatasetStats:
    """Stats of per-image ground truth as the COCO metric takes it (xyxy `boxes` in pixels,
    `labels`, optional `iscrowd` and `area`; an area of 0 or none means the box's)."""
    counts = torch.zeros(len(class_names), dtype=torch.int64)
    sizes = torch.zeros(3, dtype=torch.int64)
    empty = 0
    for image in truth:
        keep = image.get("iscrowd", torch.zeros_like(image["labels"])).reshape(-1) == 0
        labels, boxes = image["labels"].reshape(-1)[keep].long(), image["boxes"].reshape(-1, 4)[keep].double()
        box_area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        given = image.get("area")
        area = box_area if given is None else torch.where(given.reshape(-1)[keep].double() > 0,
                                                          given.reshape(-1)[keep].double(), box_area)
        counts += torch.bincount(labels, minlength=len(class_names))[: len(class_names)]
        sizes += torch.stack([(area < SMALL_AREA).sum(), ((area >= SMALL_AREA) & (area < LARGE_AREA)).sum(),
                              (area >= LARGE_AREA).sum()])
        empty += int(len(labels) == 0)
    small, medium, large = sizes.tolist()
    return DatasetStats(len(truth), dict(zip(class_names, counts.tolist())), small, medium, large, empty)
