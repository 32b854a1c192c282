"""Shared fixtures: tiny model settings that build and run in well under a second on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from detrkit.config import PretrainWeightsCompatibilityWarning

TINY = dict(
    pretrain_weights=None, device="cpu", encoder_layers=4, encoder_width=48, encoder_heads=2,
    out_feature_indexes=[2, 4], hidden_dim=32, sa_nheads=2, ca_nheads=4, dim_feedforward=64,
    dec_layers=2, num_queries=12, num_select=12, group_detr=3, resolution=64,
    positional_encoding_size=4, num_classes=5,
)


@pytest.fixture
def tiny_kwargs() -> dict:
    """ModelConfig fields of a tiny detector (64 px input, 4x4 patch grid, 2x2 windows)."""
    return dict(TINY)


@pytest.fixture(autouse=True)
def _quiet_random_weight_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainWeightsCompatibilityWarning)
        yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
