"""Read COCO keypoint annotations: the keypoint schema, each category's label slot, each annotation's keypoints.

A category's keypoint count is the length of its `keypoints` name list, or else the longest
`keypoints` vector of its annotations. Keypoint-bearing categories (count > 0, ascending id) take
the schema's slots with count > 0; the others take the remaining slots in id order (spec 13).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detrkit.datasets.keypoint_schema import (
    KeypointSchema,
    merge_pairs,
    pairs_from_names,
)

UNUSED_SLOT = -1  # the category id of a label slot that no category of the data set fills


@dataclass(frozen=True)
class CategoryKeypoints:
    """The keypoint names (empty when unnamed), skeleton and count of one category."""

    names: tuple[str, ...]
    skeleton: tuple[tuple[int, int], ...]
    count: int


def category_keypoints(data: dict, path: Path, category_ids: Sequence[int]) -> dict[int, CategoryKeypoints]:
    """What each category says about its keypoints, its count checked against its annotations'
    vectors where it names them."""
    vector_counts: dict[int, int] = {}
    for annotation in data["annotations"]:
        values = annotation.get("keypoints") if isinstance(annotation, dict) else None
        if isinstance(values, list) and values:
            if len(values) % 3:
                raise ValueError(f"{path}: annotation {annotation.get('id')} has {len(values)} keypoint values; "
                                 f"expected flat x, y, v triples (a multiple of 3)")
            category = annotation.get("category_id")
            vector_counts[category] = max(vector_counts.get(category, 0), len(values) // 3)
    result = {}
    for category in data["categories"]:
        if category["id"] not in category_ids:
            continue
        names = category.get("keypoints") or []
        skeleton = category.get("skeleton") or []
        if not isinstance(names, list) or not isinstance(skeleton, list):
            raise ValueError(f"{path}: category {category['id']} needs 'keypoints' as a list of names and "
                             f"'skeleton' as a list of [a, b] pairs, got {names!r} and {skeleton!r}")
        count = len(names) or vector_counts.get(category["id"], 0)
        result[category["id"]] = CategoryKeypoints(tuple(str(n) for n in names),
                                                   tuple(tuple(int(i) for i in edge) for edge in skeleton), count)
    return result


def keypoint_layout(data: dict, path: Path, category_ids: Sequence[int], names: Sequence[str],
                    model_counts: Sequence[int]) -> tuple[list[int], list[str], KeypointSchema]:
    """(category id per label slot, name per slot, schema) for the kept categories (sorted by id).
    `model_counts` is the model's num_keypoints_per_class; empty means "as the data says"."""
    per_category = category_keypoints(data, path, category_ids)
    counts = list(model_counts) or [per_category[c].count for c in category_ids]
    active = [slot for slot, count in enumerate(counts) if count > 0]
    bearing = [c for c in category_ids if per_category[c].count > 0]
    if not bearing:
        raise ValueError(f"{path} has no keypoints: no category lists 'keypoints' names and no annotation "
                         f"has a 'keypoints' vector")
    if len(bearing) > len(active):
        raise ValueError(f"{path} has {len(bearing)} categories with keypoints but num_keypoints_per_class "
                         f"{counts} has {len(active)} slots with keypoints; give one count per class")
    slots: dict[int, int] = dict(zip(active, bearing))
    free = [slot for slot in range(max(len(category_ids), active[-1] + 1)) if slot not in slots]
    slots.update(zip(free, [c for c in category_ids if c not in bearing]))
    width = max(counts)
    for category in bearing:
        if per_category[category].count > width:
            warnings.warn(f"{path}: category {category} has {per_category[category].count} keypoints; only the "
                          f"first {width} are kept (num_keypoints_per_class {counts})", stacklevel=3)
    order = range(max(len(counts), max(slots) + 1))
    ids = [slots.get(slot, UNUSED_SLOT) for slot in order]
    name_of = dict(zip(category_ids, names))
    slot_names = [name_of[c] if c != UNUSED_SLOT else f"unused_{slot}" for slot, c in zip(order, ids)]
    empty = CategoryKeypoints((), (), 0)
    kept = [per_category.get(c, empty) for c in ids]
    pairs = merge_pairs([pairs_from_names(k.names) if k.names else None for k in kept if k.count])
    schema = KeypointSchema(tuple(counts) + (0,) * (len(ids) - len(counts)), pairs,
                            tuple(k.names for k in kept), tuple(k.skeleton for k in kept), str(path))
    return ids, slot_names, schema


def annotation_keypoints(annotation: dict, path: Path, count: int, width: int,
                         size: tuple[int, int]) -> np.ndarray:
    """(width, 3) float32 of one annotation: x / W, y / H and v, zero where v = 0; padded with
    zeros or cut to `width`. No or an empty vector means none labelled. Errors name the annotation."""
    values = annotation.get("keypoints")
    keypoints = np.zeros((width, 3), dtype=np.float32)
    if values is None or values == []:
        return keypoints
    where = f"{path}: annotation {annotation.get('id')}"
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in values):
        raise ValueError(f"{where} has keypoints {values!r}; expected a flat list of numbers x, y, v, ...")
    if len(values) != 3 * count:
        raise ValueError(f"{where} has {len(values)} keypoint values but its category "
                         f"{annotation.get('category_id')} has {count} keypoints ({3 * count} values)")
    triples = np.array(values, dtype=np.float64).reshape(-1, 3)
    check_visibility(triples[:, 2], where)
    if not np.isfinite(triples).all():
        raise ValueError(f"{where} has a non-finite keypoint value")
    height, image_width = size
    triples[:, :2] /= (image_width, height)
    triples[triples[:, 2] == 0] = 0
    kept = min(width, len(triples))
    keypoints[:kept] = triples[:kept]
    return keypoints


def check_visibility(visibility: np.ndarray, where: str) -> None:
    """Visibility flags must be 0 (unlabelled), 1 (labelled, occluded) or 2 (visible)."""
    bad = ~np.isin(visibility, (0, 1, 2))
    if bad.any():
        slot = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{where}: keypoint {slot} has visibility {visibility[slot]:g}; expected 0, 1 or 2")
