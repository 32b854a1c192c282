"""Segmentation checkpoints load into segmentation models only (spec 11.4, rule 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from detrkit import RFDETRNano, RFDETRSegNano
from detrkit.models.weights import CheckpointError

# the tiny test architecture on the Seg Nano preset (whose own patch 12 and single window do not fit 64 px)
SEG_SHAPE = {"patch_size": 16, "num_windows": 2}


def nudged(cls, kwargs: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = cls(**kwargs)
    with torch.no_grad():
        for param in model.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def save_published(model, path: Path, **args) -> Path:
    torch.save({"model": model.model.state_dict(), "args": argparse.Namespace(**args)}, path)
    return path


def masks(model) -> torch.Tensor:
    with torch.no_grad():
        return model.model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))).pred_masks


def test_segmentation_checkpoint_reproduces_its_masks(tiny_kwargs, tmp_path):
    source = nudged(RFDETRSegNano, {**tiny_kwargs, **SEG_SHAPE})
    path = save_published(source, tmp_path / "seg.pth", segmentation_head=True, num_queries=12, group_detr=3)
    loaded = RFDETRSegNano(**{**tiny_kwargs, **SEG_SHAPE, "pretrain_weights": str(path)})
    assert torch.equal(masks(loaded), masks(source))


def test_segmentation_checkpoint_is_refused_by_a_detection_model(tiny_kwargs, tmp_path):
    path = save_published(nudged(RFDETRSegNano, {**tiny_kwargs, **SEG_SHAPE}), tmp_path / "seg.pth")
    with pytest.raises(CheckpointError, match="segmentation head.*RFDETRSegNano") as caught:
        RFDETRNano(**{**tiny_kwargs, "pretrain_weights": str(path)})
    assert isinstance(caught.value, ValueError) and str(path) in str(caught.value)


def test_checkpoint_saved_without_a_head_is_refused_by_a_segmentation_model(tiny_kwargs, tmp_path):
    path = save_published(nudged(RFDETRNano, tiny_kwargs), tmp_path / "det.pth", segmentation_head=False)
    with pytest.raises(CheckpointError, match="without a segmentation head.*RFDETRNano"):
        RFDETRSegNano(**{**tiny_kwargs, **SEG_SHAPE, "pretrain_weights": str(path)})


def test_detection_weights_without_a_declaration_seed_a_segmentation_model(tiny_kwargs, tmp_path):
    """Legacy files that do not say: detection weights load, the new head keeps its initial values."""
    source = nudged(RFDETRNano, tiny_kwargs)
    path = save_published(source, tmp_path / "det.pth")
    with pytest.warns(UserWarning, match="segmentation_head"):
        model = RFDETRSegNano(**{**tiny_kwargs, **SEG_SHAPE, "pretrain_weights": str(path)})
    assert torch.equal(model.model.class_embed.weight, source.model.class_embed.weight)
    assert torch.equal(model.model.segmentation_head.bias, torch.zeros(1))
