"""Keypoint checkpoints: they load into keypoint models only (spec 11.4, rule 2), a missing second
projector starts as a copy of the first (rule 5), and the class is found from the checkpoint."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest
import torch

from detrkit import RFDETRKeypointPreview, RFDETRLarge, RFDETRNano
from detrkit.models.weights import CheckpointError, read_checkpoint
from detrkit.variants import VARIANTS, RFDETRKeypointPreviewConfig, model_class_for

# the tiny test architecture on the keypoint preset (whose own patch 12 does not fit 64 px)
KEYPOINT_SHAPE = {"patch_size": 16, "num_keypoints_per_class": [3]}


def nudged(cls, kwargs: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = cls(**kwargs)
    with torch.no_grad():
        for param in model.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def save_published(weights: dict, path: Path, **args) -> Path:
    torch.save({"model": weights, "args": argparse.Namespace(**args)}, path)
    return path


def keypoints(model) -> torch.Tensor:
    with torch.no_grad():
        pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
        return model.model(pixels).pred_keypoints


@pytest.fixture
def source(tiny_kwargs):
    return nudged(RFDETRKeypointPreview, {**tiny_kwargs, **KEYPOINT_SHAPE})


def test_preset_is_the_published_keypoint_model():
    config = RFDETRKeypointPreviewConfig(pretrain_weights=None, device="cpu")
    assert RFDETRKeypointPreview.train_config_class.__name__ == "KeypointTrainConfig"
    assert (config.patch_size, config.num_windows, config.dec_layers, config.resolution) == (12, 2, 4, 576)
    assert (config.positional_encoding_size, config.num_queries, config.num_select) == (48, 100, 100)
    assert config.use_grouppose_keypoints and config.dual_projector and config.dual_projector_kp_only
    assert config.num_keypoints_per_class == [17] and config.keypoint_cross_attn and not config.inter_instance_kp_attn
    assert RFDETRKeypointPreviewConfig.model_fields["pretrain_weights"].default == "rf-detr-keypoint-preview-xlarge.pth"
    assert VARIANTS["keypoint-preview"] is RFDETRKeypointPreview


def test_keypoint_checkpoint_reproduces_its_keypoints(source, tiny_kwargs, tmp_path):
    weights = source.model.state_dict()
    weights["keypoint_head.keypoint_proj.weight"] = torch.zeros(4, 4)  # unused head the preview file stores
    path = save_published(weights, tmp_path / "kp.pth", num_queries=12, group_detr=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unused head is dropped without a warning
        loaded = RFDETRKeypointPreview(**{**tiny_kwargs, **KEYPOINT_SHAPE, "pretrain_weights": str(path)})
    assert torch.equal(keypoints(loaded), keypoints(source))


def test_missing_second_projector_starts_as_the_first(source, tiny_kwargs, tmp_path):
    weights = {k: v for k, v in source.model.state_dict().items() if "cross_attn_projector" not in k}
    path = save_published(weights, tmp_path / "kp.pth", num_queries=12, group_detr=3)
    loaded = RFDETRKeypointPreview(**{**tiny_kwargs, **KEYPOINT_SHAPE, "pretrain_weights": str(path)})
    backbone = loaded.model.backbone[0]
    first, second = backbone.projector.state_dict(), backbone.cross_attn_projector.state_dict()
    assert second.keys() == first.keys() and all(torch.equal(second[k], first[k]) for k in first)


def test_keypoint_checkpoint_is_refused_by_a_detection_model(source, tiny_kwargs, tmp_path):
    path = save_published(source.model.state_dict(), tmp_path / "kp.pth")
    with pytest.raises(CheckpointError, match="keypoint heads.*RFDETRKeypointPreview") as caught:
        RFDETRNano(**{**tiny_kwargs, "pretrain_weights": str(path), "patch_size": 16})
    assert str(path) in str(caught.value)


def test_checkpoint_saved_without_keypoints_is_refused_by_a_keypoint_model(tiny_kwargs, tmp_path):
    path = save_published(nudged(RFDETRNano, tiny_kwargs).model.state_dict(), tmp_path / "det.pth",
                          use_grouppose_keypoints=False)
    with pytest.raises(CheckpointError, match="without keypoint heads.*RFDETRNano"):
        RFDETRKeypointPreview(**{**tiny_kwargs, **KEYPOINT_SHAPE, "pretrain_weights": str(path)})


@pytest.mark.parametrize("model_name, weights, file_name, expected", [
    ("RFDETRKeypointPreview", None, "run-small.pth", RFDETRKeypointPreview),
    (None, "rf-detr-keypoint-preview-xlarge.pth", "x.pth", RFDETRKeypointPreview),  # not Large
    (None, None, "rf-detr-keypoint-preview-xlarge.pth", RFDETRKeypointPreview),
    (None, None, "rf-detr-large-2026.pth", RFDETRLarge),
])
def test_keypoint_class_is_resolved_by_name(source, tmp_path, model_name, weights, file_name, expected):
    path = tmp_path / file_name
    args = {"pretrain_weights": weights} if weights else {}
    torch.save({"model": {"class_embed.bias": torch.zeros(6)}, "args": args, "model_name": model_name}, path)
    assert model_class_for(read_checkpoint(path), path) is expected


def test_keypoint_weights_under_any_name_resolve_to_the_keypoint_class(source, tmp_path):
    path = save_published(source.model.state_dict(), tmp_path / "run-small.pth")
    assert model_class_for(read_checkpoint(path), path) is RFDETRKeypointPreview
