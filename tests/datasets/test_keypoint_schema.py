"""Keypoint flip maps: pairs from names, flip_idx and config, and when a mirroring pipeline is refused."""

from __future__ import annotations

import pytest
import torch

from detrkit.datasets.keypoint_schema import (
    KeypointFlip,
    KeypointSchema,
    pairs_from_flat,
    pairs_from_flip_index,
    pairs_from_names,
    resolve_flip,
    split_name,
)

COCO_PERSON = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
               "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
               "right_knee", "left_ankle", "right_ankle"]


def test_names_split_into_words_in_any_spelling():
    assert split_name("leftEye") == split_name("Left-eye") == split_name(" left_eye ") == ["left", "eye"]


def test_coco_person_names_pair_left_with_right():
    pairs = pairs_from_names(COCO_PERSON)
    assert pairs == tuple((i, i + 1) for i in range(1, 17, 2))
    assert pairs_from_names(["tail", "nose"]) == ()  # no sides: a mirror keeps every label
    assert pairs_from_names(["RightHand", "LeftHand", "head"]) == ((0, 1),)


@pytest.mark.parametrize("names", [["left_eye", "nose"], ["left_right"], ["left_eye", "left_eye", "right_eye"]])
def test_names_with_sides_that_do_not_pair_give_no_map(names):
    assert pairs_from_names(names) is None


def test_flip_idx_becomes_pairs_and_must_swap_in_pairs():
    assert pairs_from_flip_index([0, 2, 1, 4, 3], "data.yaml") == ((1, 2), (3, 4))
    assert pairs_from_flip_index([0, 1], "data.yaml") == ()
    with pytest.raises(ValueError, match="data.yaml: flip_idx \\[1, 2, 0\\]"):
        pairs_from_flip_index([1, 2, 0], "data.yaml")
    with pytest.raises(ValueError, match="flip_idx"):
        pairs_from_flip_index([0, 0], "data.yaml")


def test_flat_pairs_are_checked():
    assert pairs_from_flat([1, 2, 3, 4], 5, "pairs") == ((1, 2), (3, 4))
    for bad in ([1], [1, 1], [0, 5]):
        with pytest.raises(ValueError, match="pairs"):
            pairs_from_flat(bad, 5, "pairs")
    assert pairs_from_flat([7, 9], None, "pairs") == ((7, 9),)


def test_flip_index_swaps_the_pairs():
    assert KeypointFlip(((0, 1), (2, 3))).index(5).tolist() == [1, 0, 3, 2, 4]
    assert KeypointFlip(()).index(3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="out of range"):
        KeypointFlip(((0, 4),)).index(3)
    with pytest.raises(ValueError, match="no keypoint flip map"):
        KeypointFlip(None).index(3)


def schema(pairs, names=((),)) -> KeypointSchema:
    return KeypointSchema((3,), pairs, names, (), "/data/train.json")


def test_configured_pairs_win_over_the_data_sets():
    flip = resolve_flip(schema(((0, 1),)), [1, 2], mirrors=True)
    assert flip.pairs == ((1, 2),)
    with pytest.raises(ValueError, match="TrainConfig.keypoint_flip_pairs"):
        resolve_flip(schema(None), [0, 3], mirrors=True)  # only 3 keypoints


def test_a_known_map_or_no_mirror_is_fine():
    assert resolve_flip(schema(((0, 1),)), [], mirrors=True).pairs == ((0, 1),)
    assert resolve_flip(schema(()), [], mirrors=True).pairs == ()
    assert resolve_flip(schema(None), [], mirrors=False).pairs is None


@pytest.mark.parametrize("names, reason", [(((),), "does not name its keypoints"),
                                           ((("left_eye", "nose", "x"),), "does not pair up")])
def test_a_mirroring_pipeline_without_a_map_is_refused_naming_the_file(names, reason):
    with pytest.raises(ValueError, match=f"/data/train.json .*{reason}.*keypoint_flip_pairs") as error:
        resolve_flip(schema(None, names), [], mirrors=True)
    assert "aug_config={}" in str(error.value)


def test_schema_lists_coco_fields_per_slot():
    layout = KeypointSchema((0, 2), ((0, 1),), ((), ("l", "r")), ((), ((1, 2),)), "f")
    assert layout.width == 2
    assert layout.coco_fields(1) == {"keypoints": ["l", "r"], "skeleton": [[1, 2]]}
    assert layout.coco_fields(0) == {"keypoints": [], "skeleton": []}
    assert KeypointSchema((2,), None).coco_fields(0)["keypoints"] == ["keypoint_0", "keypoint_1"]
    assert isinstance(KeypointFlip(()).index(2), torch.Tensor)
