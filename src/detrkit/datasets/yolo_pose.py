"""Read the YOLO pose format: `kpt_shape`, `flip_idx` and `kpt_names` in data.yaml, and label lines with keypoints.

A pose label line is `cls cx cy w h` followed by K keypoints of `x y` or `x y v` (normalised).
With two numbers a keypoint with a negative coordinate is absent and any other is visible
(v = 2), as Ultralytics reads them; with three, v must be 0, 1 or 2.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from detrkit.datasets.coco_keypoints import check_visibility
from detrkit.datasets.keypoint_schema import (
    FlipPairs,
    KeypointSchema,
    merge_pairs,
    pairs_from_flip_index,
    pairs_from_names,
)


@dataclass(frozen=True)
class PoseFormat:
    """What data.yaml says about keypoints: `count` per instance of `dims` (2 or 3) numbers each,
    their names per class (empty when unnamed) and the flip pairs (None when it cannot tell)."""

    count: int
    dims: int
    names: tuple[tuple[str, ...], ...]
    flip_pairs: FlipPairs | None


def read_pose_format(data: dict, path: Path, num_classes: int) -> PoseFormat | None:
    """The pose format of a parsed data.yaml, or None when it has no `kpt_shape` (not a pose data
    set). Flip pairs come from `flip_idx`, else from left/right keypoint names."""
    shape = data.get("kpt_shape")
    if shape is None:
        return None
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(v, int) for v in shape)
            and shape[0] > 0 and shape[1] in (2, 3)):
        raise ValueError(f"{path}: kpt_shape must be [number of keypoints, 2 or 3], got {shape!r}")
    count, dims = shape
    names = _keypoint_names(data.get("kpt_names"), count, num_classes, path)
    flip_idx = data.get("flip_idx")
    if flip_idx is not None:
        if not (isinstance(flip_idx, list) and len(flip_idx) == count and all(isinstance(i, int) for i in flip_idx)):
            raise ValueError(f"{path}: flip_idx must list {count} keypoint indices (kpt_shape {shape}), "
                             f"got {flip_idx!r}")
        pairs = pairs_from_flip_index(flip_idx, str(path))
    else:
        pairs = merge_pairs([pairs_from_names(n) for n in names]) if any(names) else None
    return PoseFormat(count, dims, names, pairs)


def _keypoint_names(value: object, count: int, num_classes: int, path: Path) -> tuple[tuple[str, ...], ...]:
    """`kpt_names` as a list (every class) or a dict {class index: list}; empty tuples when absent."""
    if value is None:
        return ((),) * num_classes
    per_class = value if isinstance(value, dict) else {index: value for index in range(num_classes)}
    names = []
    for index in range(num_classes):
        listed = per_class.get(index, per_class.get(str(index), []))
        if not isinstance(listed, list) or len(listed) not in (0, count):
            raise ValueError(f"{path}: kpt_names must list {count} names (kpt_shape), for every class or per "
                             f"class index, got {listed!r} for class {index}")
        names.append(tuple(str(name) for name in listed))
    return tuple(names)


def pose_schema(pose: PoseFormat, num_classes: int, model_counts: Sequence[int], path: Path) -> KeypointSchema:
    """Every class has the data's keypoints, unless the model says otherwise (`model_counts`)."""
    counts = tuple(model_counts) or (pose.count,) * num_classes
    if pose.count > max(counts):
        warnings.warn(f"{path}: kpt_shape has {pose.count} keypoints; only the first {max(counts)} are kept "
                      f"(num_keypoints_per_class {list(counts)})", stacklevel=3)
    return KeypointSchema(counts, pose.flip_pairs, pose.names, (), str(path))


def pose_row(values: list[float], pose: PoseFormat, path: Path, number: int) -> tuple[np.ndarray, np.ndarray]:
    """(box xyxy, (K, 3) keypoints x, y, v with unlabelled ones zeroed) of a pose line's numbers
    (the class first), all normalised; a line of the wrong length is an error naming it."""
    expected = 5 + pose.count * pose.dims
    if len(values) != expected:
        raise ValueError(f"{path} line {number}: a pose line is 'cls cx cy w h' and {pose.count} keypoints of "
                         f"{pose.dims} values (kpt_shape), {expected} values, got {len(values)}")
    cx, cy, w, h = values[1:5]
    points = np.array(values[5:], dtype=np.float64).reshape(pose.count, pose.dims)
    if pose.dims == 3:
        check_visibility(points[:, 2], f"{path} line {number}")
        visibility = points[:, 2]
    else:
        visibility = np.where((points < 0).any(axis=1), 0.0, 2.0)
    keypoints = np.concatenate([points[:, :2], visibility[:, None]], axis=1)
    keypoints[visibility == 0] = 0
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]), keypoints


def fit_width(keypoints: list[np.ndarray], width: int) -> np.ndarray:
    """(N, width, 3) float32 from N (K, 3) arrays: padded with zeros or cut."""
    out = np.zeros((len(keypoints), width, 3), dtype=np.float32)
    for row, points in enumerate(keypoints):
        kept = min(width, len(points))
        out[row, :kept] = points[:kept]
    return out
