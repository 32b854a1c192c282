"""Training on PyTorch Lightning: `build_trainer`, `RFDETRModelModule`, `RFDETRDataModule`."""

from detrkit.training.datamodule import RFDETRDataModule
from detrkit.training.module import RFDETRModelModule
from detrkit.training.trainer import build_trainer

__all__ = ["RFDETRDataModule", "RFDETRModelModule", "build_trainer"]
