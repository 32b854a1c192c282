"""Shared fixtures: tiny model settings that build and run in well under a second on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_config import TINY

from detrkit.config import PretrainWeightsCompatibilityWarning


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
