"""The keypoint layout of a data set: keypoints per class slot and how a mirror image relabels them.

Keypoint names are read as the object's own sides ("left_eye" is the person's left eye), so a
rotation keeps every label and any reflection (a horizontal flip, a vertical one, a transpose)
swaps each left/right pair. A data set whose names say nothing about sides mirrors without
relabelling; one that names sides it does not pair, or gives no names at all, has no flip map,
and a pipeline that mirrors its images is refused before training starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

FlipPairs = tuple[tuple[int, int], ...]
_SIDES = {"left": "right", "right": "left"}


@dataclass(frozen=True)
class KeypointSchema:
    """Keypoints per class slot (label i has `num_keypoints_per_class[i]`, 0 for a class without
    keypoints); every instance carries `width` = max of them. `flip_pairs` swap under a mirror
    (empty: mirroring keeps every label; None: the data cannot tell). `names` and `skeleton` per
    slot are empty where the data gives none; `source` names the file the schema was read from."""

    num_keypoints_per_class: tuple[int, ...]
    flip_pairs: FlipPairs | None
    names: tuple[tuple[str, ...], ...] = ()
    skeleton: tuple[tuple[tuple[int, int], ...], ...] = ()
    source: str = ""

    @property
    def width(self) -> int:
        return max(self.num_keypoints_per_class, default=0)

    @property
    def edges(self) -> list[list[tuple[int, int]]]:
        """Each slot's skeleton as 0-based keypoint pairs (COCO's count from 1)."""
        return [[(a - 1, b - 1) for a, b in slot] for slot in self.skeleton]

    def coco_fields(self, label: int) -> dict:
        """The `keypoints` names and `skeleton` a COCO category for this slot lists."""
        count = self.num_keypoints_per_class[label] if label < len(self.num_keypoints_per_class) else 0
        names = self.names[label] if label < len(self.names) else ()
        skeleton = self.skeleton[label] if label < len(self.skeleton) else ()
        return {"keypoints": list(names) or [f"keypoint_{i}" for i in range(count)],
                "skeleton": [list(edge) for edge in skeleton]}


@dataclass(frozen=True)
class KeypointFlip:
    """What a mirror does to keypoint slots: `pairs` swap; None when no flip map is known, so a
    mirrored keypoint sample is an error rather than a silently mislabelled one."""

    pairs: FlipPairs | None

    def index(self, count: int) -> torch.Tensor:
        """(count,) slot permutation: output slot k takes input slot index[k]."""
        if self.pairs is None:
            raise ValueError("a keypoint sample was mirrored, but its data set has no keypoint flip map; give "
                             "TrainConfig.keypoint_flip_pairs or leave mirroring transforms out of the pipeline")
        index = torch.arange(count)
        for left, right in self.pairs:
            if max(left, right) >= count:
                raise ValueError(f"keypoint flip pair ({left}, {right}) is out of range for {count} keypoints")
            index[left], index[right] = right, left
        return index


def split_name(name: object) -> list[str]:
    """Lower-case word tokens of a keypoint name: "leftEye", "Left-eye" and "left_eye" give ["left", "eye"]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name).strip())
    return [token for token in re.split(r"[^a-z0-9]+", spaced.lower()) if token]


def is_handed(name: object) -> bool:
    return any(token in _SIDES for token in split_name(name))


def pairs_from_names(names: Sequence[object]) -> FlipPairs | None:
    """Left/right pairs by name ("left_knee" <-> "right_knee"); None when a name with a side has
    no counterpart, has both sides, or names repeat. Names without sides stay where they are."""
    keys = ["_".join(split_name(name)) for name in names]
    position = {key: index for index, key in enumerate(keys)}
    if len(position) != len(keys) and any(is_handed(name) for name in names):
        return None
    pairs = []
    for index, name in enumerate(names):
        tokens = split_name(name)
        if sum(token in _SIDES for token in tokens) == 0:
            continue
        if sum(token in _SIDES for token in tokens) > 1:
            return None
        mirror = position.get("_".join(_SIDES.get(token, token) for token in tokens))
        if mirror is None:
            return None
        if index < mirror:
            pairs.append((index, mirror))
    return tuple(pairs)


def pairs_from_flip_index(flip_idx: Sequence[int], where: str) -> FlipPairs:
    """Ultralytics' flip_idx (flip_idx[i] = the slot keypoint i becomes when mirrored) as pairs;
    it must be a permutation of 0..K-1 that is its own inverse."""
    count = len(flip_idx)
    if sorted(flip_idx) != list(range(count)) or any(flip_idx[flip_idx[i]] != i for i in range(count)):
        raise ValueError(f"{where}: flip_idx {list(flip_idx)} must swap keypoints in pairs: a permutation "
                         f"of 0..{count - 1} that is its own inverse")
    return tuple((i, j) for i, j in enumerate(flip_idx) if i < j)


def pairs_from_flat(flat: Sequence[int], count: int | None, where: str) -> FlipPairs:
    """Flat [a0, b0, a1, b1, ...] pairs (TrainConfig.keypoint_flip_pairs) checked against `count`
    slots (any count when None; KeypointFlip.index checks them when applied)."""
    limit = count if count is not None else float("inf")
    if len(flat) % 2 or any(not 0 <= index < limit for index in flat) or len(set(flat)) != len(flat):
        span = f"0..{count - 1}" if count is not None else "0, 1, ..."
        raise ValueError(f"{where} {list(flat)} must list pairs of distinct keypoint indices in {span}, "
                         f"each index at most once")
    return tuple((int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))


def merge_pairs(per_class: Sequence[FlipPairs | None]) -> FlipPairs | None:
    """One flip map for all keypoint classes: theirs when they agree, else None (padding puts every
    class in the same slots, so one permutation serves all of them or none)."""
    if not per_class:
        return ()
    first = per_class[0]
    return first if all(pairs == first for pairs in per_class) else None


def resolve_flip(schema: KeypointSchema, configured: Sequence[int], mirrors: bool) -> KeypointFlip:
    """The flip map training uses: TrainConfig.keypoint_flip_pairs when given, else the schema's.
    A mirroring pipeline over keypoints without a known map is refused, naming the data file."""
    if configured:
        return KeypointFlip(pairs_from_flat(configured, schema.width, "TrainConfig.keypoint_flip_pairs"))
    if schema.flip_pairs is not None or not mirrors:
        return KeypointFlip(schema.flip_pairs)
    named = any(schema.names)
    reason = ("names keypoints with a left or right side that it does not pair up (or its classes pair them "
              "differently)") if named else "does not name its keypoints, so their left/right pairs are unknown"
    raise ValueError(f"{schema.source} {reason}, and the training pipeline mirrors images (a horizontal flip in "
                     f"the default pipeline or a flip in aug_config), which would mislabel them. Give "
                     f"TrainConfig.keypoint_flip_pairs (flat index pairs) or a YOLO flip_idx, name the keypoints, "
                     f"or train without mirroring (an aug_config without flips; aug_config={{}} for none)")
