"""What a run records beside its checkpoints: training_config.json (written atomically at the
start and end of a run) and metrics.csv rows carried over on resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytorch_lightning as pl

from detrkit.config import ModelConfig, TrainConfig
from detrkit.training.checkpoints import replace_atomically
from detrkit.training.epoch_csv import METRICS_FILE, EpochCSVLogger


def write_json_atomically(path: Path, payload: dict) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    replace_atomically(path, lambda stream: stream.write(json.dumps(payload, indent=2).encode()))


def write_training_config(train_config: TrainConfig, model_config: ModelConfig, class_names: list[str]) -> Path:
    path = Path(train_config.output_dir) / "training_config.json"
    write_json_atomically(path, {
        "train_config": train_config.model_dump(mode="json"),
        "model_config": model_config.model_dump(mode="json"),
        "model_config_type": type(model_config).__name__,
        "class_names": class_names,
        "num_classes": len(class_names),
    })
    return path


class TrainingConfigRecord(pl.Callback):
    """training_config.json from the main process, when fitting starts (after the data set and
    any resume checkpoint were checked) and again when it ends."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, pl_module)

    @staticmethod
    def _write(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            write_training_config(pl_module.train_config, pl_module.model_config, pl_module.class_names or [])


def carry_over_metrics(trainer: pl.Trainer, output_dir: str, last_epoch: int) -> None:
    """Keep the metrics.csv rows of epochs up to `last_epoch` when resuming into the same directory
    (a new run starts its file afresh); rows of later, interrupted epochs are dropped."""
    path = Path(output_dir) / METRICS_FILE
    loggers = [lg for lg in trainer.loggers if isinstance(lg, EpochCSVLogger)]
    if not path.is_file() or not loggers or not trainer.is_global_zero:
        return
    with open(path, newline="") as stream:
        rows = list(csv.DictReader(stream))
    loggers[0].experiment.keep(rows, last_epoch)  # written with the first new rows
