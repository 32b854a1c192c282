"""Optimizer, scheduler, loss and logging settings through model.train() on a tiny model and data set."""

import csv
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping

from detrkit import RFDETRNano
from detrkit.config import TrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training import RFDETRDataModule

FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=3,
                                  num_test=2, image_size=(96, 64), seed=0)


class Spy(pl.Callback):
    """What the Trainer was given to optimise with, and the validation batch sizes."""

    def on_train_start(self, trainer, pl_module):
        self.optimizer = trainer.optimizers[0]
        self.scheduler = trainer.lr_scheduler_configs[0]
        self.val_batch_size = trainer.val_dataloaders.batch_size


def columns(output: Path) -> tuple[set[str], list[dict]]:
    with open(output / "metrics.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    return set(rows[0]), rows


def test_plateau_on_val_loss_with_sgd_and_per_layer_step_logs(data, tmp_path, tiny_kwargs):
    spy = Spy()
    RFDETRNano(**tiny_kwargs).train(
        dataset_dir=data, output_dir=tmp_path, epochs=2, optimizer="sgd", optimizer_kwargs={"momentum": 0.9},
        lr_scheduler="torch.optim.lr_scheduler.ReduceLROnPlateau", lr_scheduler_kwargs={"patience": 0},
        compact_train_metrics=False, train_log_on_step=True, eval_batch_size=3, run_test=True,
        callbacks=[spy], **FAST)
    assert isinstance(spy.optimizer, torch.optim.SGD) and spy.optimizer.defaults["momentum"] == 0.9
    assert len(spy.optimizer.param_groups) > 1  # detrkit's groups: encoder layers and decoder at their own rates
    scheduler = spy.scheduler
    assert isinstance(scheduler.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert (scheduler.interval, scheduler.monitor) == ("epoch", "val/loss")
    assert spy.val_batch_size == 3
    names, rows = columns(tmp_path)
    val_losses = [float(row["val/loss"]) for row in rows if row.get("val/loss")]
    assert len(val_losses) == 2 and all(loss > 0 for loss in val_losses)  # "auto": the plateau monitors it
    assert [row["test/loss"] for row in rows if row.get("test/loss")]  # compute_test_loss defaults to True
    # each layer's term on its own, per epoch (_epoch) in metrics.csv and per step (_step) in metrics_steps.csv
    assert "train/loss_ce_0_epoch" in names and not any(name.endswith("_step") for name in names)
    with open(tmp_path / "metrics_steps.csv", newline="") as stream:
        step_names = set(next(csv.DictReader(stream)))
    assert {"train/loss_bbox_enc_step", "train/loss_ce_step", "train/loss_step"} <= step_names
    assert not any(name.startswith("train/loss_ce_aux") for name in names)


def test_val_loss_follows_compute_val_loss_and_test_loss_compute_test_loss(data, tmp_path, tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=data, output_dir=tmp_path / "auto", epochs=1, run_test=True, **FAST)
    names, _ = columns(tmp_path / "auto")
    assert "val/loss" not in names and "test/loss" in names  # nothing monitors val/loss
    assert {"train/loss", "train/loss_ce_aux"} <= names and "train/loss_step" not in names  # compact, per epoch
    model.train(dataset_dir=data, output_dir=tmp_path / "forced", epochs=1, run_test=True, compute_val_loss=True,
                compute_test_loss=False, lr_scheduler="torch.optim.lr_scheduler.StepLR",
                lr_scheduler_kwargs={"step_size": 1}, **FAST)
    names, _ = columns(tmp_path / "forced")
    assert "val/loss" in names and "test/loss" not in names


def test_disabled_val_loss_with_a_val_loss_monitor_is_an_error(data, tmp_path, tiny_kwargs):
    with pytest.raises(ValueError, match="compute_val_loss=False, but a callback or scheduler monitors"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=data, output_dir=tmp_path, epochs=1, compute_val_loss=False,
                                        callbacks=[EarlyStopping(monitor="val/loss")], **FAST)


def test_features_of_other_issues_raise_not_implemented(tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    with pytest.raises(NotImplementedError, match="pad_targets_to=8"):
        RFDETRDataModule(model.model_config, TrainConfig(dataset_dir=None, pad_targets_to=8))


def test_compute_train_metrics_logs_training_map_beside_validation_and_grids_are_drawn(data, tmp_path, tiny_kwargs):
    RFDETRNano(**tiny_kwargs).train(dataset_dir=data, output_dir=tmp_path, epochs=2, compute_train_metrics=True,
                                    save_dataset_grids=True, **FAST)
    names, rows = columns(tmp_path)
    assert {"train/mAP_50_95", "train/mAP_50", "val/mAP_50_95"} <= names
    values = [float(row["train/mAP_50"]) for row in rows]
    assert len(values) == 2 and all(0 <= value <= 1 for value in values)
    assert sorted(path.name for path in (tmp_path / "dataset_grids").iterdir()) == ["train_grid.png", "valid_grid.png"]
