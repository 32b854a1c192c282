"""metrics.csv with one row per epoch: the training and validation values of an epoch side by side.

Lightning's CSVLogger writes a row per call (training values, validation values and step logs
each on their own row). EpochCSVLogger merges the values logged for an epoch into its row
(columns: epoch, step, then train/*, val/*, test/* and others, alphabetically) and rewrites the
file atomically when Lightning saves; values logged per step (names ending in "_step", or
logged without an epoch, such as a LearningRateMonitor's) go to metrics_steps.csv instead. The
epoch column keeps Lightning's 0-based count; the test values after fit land on a row of their own.
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from lightning_fabric.loggers.logger import rank_zero_experiment
from pytorch_lightning.loggers import CSVLogger
from torch import Tensor

from detrkit.training.checkpoints import replace_atomically

METRICS_FILE, STEPS_FILE = "metrics.csv", "metrics_steps.csv"


class EpochRows:
    """The experiment behind EpochCSVLogger: rows by epoch, and the step rows, written on save()."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.rows: dict[int, dict[str, float]] = {}
        self.step_rows: list[dict[str, float]] = []
        self.metrics_file_path = os.path.join(log_dir, METRICS_FILE)
        os.makedirs(log_dir, exist_ok=True)
        for name in (METRICS_FILE, STEPS_FILE):  # a new run's files start afresh (resume: see keep())
            if os.path.isfile(os.path.join(log_dir, name)):
                os.remove(os.path.join(log_dir, name))

    @property
    def metrics(self) -> list[dict[str, float]]:  # CSVLogger counts these when a log comes without a step
        return self.step_rows

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        values = {key: value.item() if isinstance(value, Tensor) else value for key, value in metrics.items()}
        if "epoch" not in values or any(key.endswith("_step") for key in values):
            self.step_rows.append({**values, "step": step if step is not None else len(self.step_rows)})
            return
        epoch = int(values.pop("epoch"))
        row = self.rows.setdefault(epoch, {"epoch": epoch})
        row.update(values)
        if step is not None:
            row["step"] = max(int(row.get("step", step)), step)

    def keep(self, rows: list[dict[str, str]], last_epoch: int) -> None:
        """Rows of epochs up to `last_epoch` from an earlier metrics.csv (either layout), numbers again."""
        for row in rows:
            if not row.get("epoch", "").isdigit() or int(row["epoch"]) > last_epoch:
                continue
            values = {key: int(value) if key in ("epoch", "step") else float(value)
                      for key, value in row.items() if key and value != ""}
            self.rows.setdefault(values["epoch"], {}).update(values)

    def log_hparams(self, params: dict[str, Any]) -> None:  # training_config.json records them
        pass

    def save(self) -> None:
        if self.rows:
            ordered = [self.rows[epoch] for epoch in sorted(self.rows)]
            _write(self.metrics_file_path, ordered, ("epoch", "step"))
        if self.step_rows:
            _write(os.path.join(self.log_dir, STEPS_FILE), self.step_rows, ("epoch", "step"))


def _column_order(name: str, first: tuple[str, ...]) -> tuple[int, str]:
    if name in first:
        return first.index(name), ""
    stage = name.split("/", 1)[0] if "/" in name else ""
    return len(first) + {"train": 0, "val": 1, "test": 2}.get(stage, 3), name


def _write(path: str, rows: list[dict[str, Any]], first: tuple[str, ...]) -> None:
    names = sorted({key for row in rows for key in row}, key=lambda name: _column_order(name, first))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    replace_atomically(path, lambda stream: stream.write(text.getvalue().encode()))


class EpochCSVLogger(CSVLogger):
    """Lightning's CSVLogger (same place, same save points) writing one row per epoch; see the module."""

    def __init__(self, save_dir: str) -> None:
        super().__init__(save_dir=save_dir, name="", version="")

    @property
    @rank_zero_experiment
    def experiment(self) -> EpochRows:
        if self._experiment is None:
            self._experiment = EpochRows(self.log_dir)
        return self._experiment

    def log_hyperparams(self, params: Any = None) -> None:
        pass
