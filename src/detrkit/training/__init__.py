"""Training on PyTorch Lightning: `build_trainer`, `RFDETRModelModule`, `RFDETRDataModule`.

The three load lazily, so that pure submodules (optim, coco_map, ...) import without Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RFDETRDataModule": "detrkit.training.datamodule",
    "RFDETRModelModule": "detrkit.training.module",
    "build_trainer": "detrkit.training.trainer",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'detrkit.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
