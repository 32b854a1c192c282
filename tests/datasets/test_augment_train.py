"""train() end to end with each augmentation backend, and with mosaic and mixup, on tiny data."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from detrkit import RFDETRNano
from detrkit.datasets.aug_configs import AUG_AGGRESSIVE
from detrkit.datasets.synthetic import make_synthetic_dataset

FAST = dict(epochs=1, batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=2,
                                  image_size=(96, 64), seed=0)


class Batches(pl.Callback):
    """Records what the model gets in each training step: pixel statistics and boxes per image."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.append({"epoch": trainer.current_epoch, "dtype": batch.pixels.dtype,
                          "min": batch.pixels.min().item(), "max": batch.pixels.max().item(),
                          "boxes": [len(t.labels) for t in batch.targets],
                          "inside": all(((t.boxes[:, :2] - t.boxes[:, 2:] / 2 >= -1e-5).all()
                                         and (t.boxes[:, :2] + t.boxes[:, 2:] / 2 <= 1 + 1e-5).all()).item()
                                        for t in batch.targets)})


def train(data: Path, output: Path, tiny_kwargs: dict, **kwargs) -> tuple[RFDETRNano, Batches]:
    spy = Batches()
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(data), output_dir=str(output), callbacks=[spy], **{**FAST, **kwargs})
    assert (output / "last.ckpt").is_file()
    return model, spy


def assert_normalised_batches(spy: Batches) -> None:
    assert spy.seen
    for batch in spy.seen:
        assert batch["dtype"] == torch.float32 and batch["inside"]
        assert -2.2 < batch["min"] < 0 < batch["max"] < 2.7  # ImageNet-normalised pixels


@pytest.mark.parametrize("backend", ["torchvision", "albumentations", "kornia"])
def test_trains_with_each_backend(backend, data, tmp_path, tiny_kwargs):
    if backend != "torchvision":
        pytest.importorskip(backend)
    aug_config = None if backend == "torchvision" else AUG_AGGRESSIVE
    model, spy = train(data, tmp_path / "out", tiny_kwargs, aug_config=aug_config, augmentation_backend=backend)
    assert_normalised_batches(spy)
    weights = model.model.class_embed.weight
    assert torch.isfinite(weights).all()


def test_kornia_batches_leave_the_loader_as_uint8_and_validation_is_untouched(data, tmp_path, tiny_kwargs):
    pytest.importorskip("kornia")
    from detrkit.training import RFDETRDataModule
    from detrkit.training.trainer import split_train_kwargs

    config, _ = split_train_kwargs({**FAST, "dataset_dir": str(data), "aug_config": {"HorizontalFlip": {}},
                                    "augmentation_backend": "gpu"})
    model = RFDETRNano(**tiny_kwargs)
    datamodule = RFDETRDataModule(model.model_config, config)
    train_batch = next(iter(datamodule.train_dataloader()))
    valid_batch = next(iter(datamodule.val_dataloader()))
    assert train_batch.pixels.dtype == torch.uint8 and valid_batch.pixels.dtype == torch.float32


def test_mosaic_and_mixup_train_and_stop_for_the_last_epochs(data, tmp_path, tiny_kwargs):
    pytest.importorskip("kornia")
    _, spy = train(data, tmp_path / "out", tiny_kwargs, epochs=2, mosaic=1.0, mixup=1.0, close_mosaic_epochs=1,
                   aug_config={"HorizontalFlip": {"p": 0.5}}, augmentation_backend="kornia", eval_interval=2)
    assert_normalised_batches(spy)
    per_epoch = {epoch: [n for b in spy.seen if b["epoch"] == epoch for n in b["boxes"]] for epoch in (0, 1)}
    # mosaic of four images, blended with a fifth: several images' boxes each, until the last epoch
    assert min(per_epoch[0]) > max(per_epoch[1]) >= 1


def test_workers_draw_the_same_augmented_samples_as_the_main_process(data, tiny_kwargs):
    """Albumentations, mosaic and mixup draw from each sample's seed, not from a worker's state."""
    pytest.importorskip("albumentations")
    from detrkit.training import RFDETRDataModule
    from detrkit.training.trainer import split_train_kwargs

    model = RFDETRNano(**tiny_kwargs)
    batches = []
    for workers in (0, 2):
        config, _ = split_train_kwargs({**FAST, "num_workers": workers, "dataset_dir": str(data),
                                        "aug_config": AUG_AGGRESSIVE, "mosaic": 0.5, "mixup": 0.5})
        batches.append(list(RFDETRDataModule(model.model_config, config).train_dataloader()))
    for plain, worked in zip(*batches):
        assert torch.equal(plain.pixels, worked.pixels)
        assert all(torch.equal(a.boxes, b.boxes) for a, b in zip(plain.targets, worked.targets))
