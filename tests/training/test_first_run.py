"""What a first run shows and leaves behind: the start block, epoch numbering, the run's time
estimate, metrics.csv with one row per epoch (kept across a resume), results.png, file
permissions under the user's umask, and dont_save_weights."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from detrkit import RFDETRNano
from detrkit.analysis.results_plot import panels, read_epochs
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training.callbacks.progress import format_duration
from detrkit.training.callbacks.start_report import scales_used, warn_about_classes

FAST = {"batch_size": 2, "num_workers": 0, "tensorboard": False, "seed": 0, "multi_scale": "per-batch"}
UMASK = 0o027


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Shapes whose training split has no triangles: triangles are present only in validation."""
    root = make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=3,
                                  image_size=(96, 64), seed=0)
    path = root / "train" / "_annotations.coco.json"
    coco = json.loads(path.read_text())
    ids = {category["name"]: category["id"] for category in coco["categories"]}
    for annotation in coco["annotations"]:
        if annotation["category_id"] == ids["triangle"]:
            annotation["category_id"] = ids["square"]
    path.write_text(json.dumps(coco))
    return root


def train_and_capture(output: Path, **options) -> tuple[list[str], str, list[str]]:
    """Train the tiny model under UMASK; returns the log messages, the progress bars' text and warnings."""
    from tiny_config import TINY

    torch.manual_seed(0)
    handler, bars = Records(), io.StringIO()
    lightning = logging.getLogger("pytorch_lightning")
    lightning.addHandler(handler)
    previous_level, previous_umask = lightning.level, os.umask(UMASK)
    lightning.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stderr(bars), \
                contextlib.redirect_stdout(bars):
            warnings.simplefilter("always")
            RFDETRNano(**TINY).train(output_dir=str(output), **{**FAST, **options})
    finally:
        os.umask(previous_umask)
        lightning.removeHandler(handler)
        lightning.setLevel(previous_level)
    return handler.messages, bars.getvalue(), [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    output = tmp_path_factory.mktemp("first_run")
    messages, bars, warned = train_and_capture(output, dataset_dir=str(data), epochs=2, progress_bar="tqdm")
    return output, messages, bars, warned


def read_rows(output: Path) -> list[dict[str, str]]:
    with open(output / "metrics.csv", newline="") as stream:
        return list(csv.DictReader(stream))


def test_start_block_says_what_will_happen(run, data):
    output, messages, _, _ = run
    blocks = [message for message in messages if message.startswith("run:")]
    assert len(blocks) == 1
    block = blocks[0]
    assert f"data: roboflow format, {data}" in block
    assert "splits: train 6 images, " in block and "; valid 3 images, " in block
    assert "classes (3), train/valid instances: circle " in block and "triangle 0/" in block
    parameters = sum(p.numel() for p in RFDETRNano(**__import__("tiny_config").TINY).model.parameters())
    assert f"model: RFDETRNano, {parameters:,} parameters" in block
    assert "weights: none, training from scratch" in block
    assert "resolution: 64 px; multi-scale per-batch: 64 to " in block  # the tiny model's 32 px blocks
    assert "precision: 32-true; devices: 1 x cpu" in block
    assert "effective batch: 2 per device x 1 accumulation x 1 device = 2 images per step" in block
    assert "epochs: 2, 5 steps each, 10 steps in all; validation every epoch" in block
    assert f"files: {output} (best weights checkpoint_best_total.pth, full state for resume last.ckpt" in block
    assert messages.index(block) < min(i for i, m in enumerate(messages) if m.startswith("epoch 1/2:"))


def test_warnings_for_classes_and_short_runs_from_scratch(run):
    warned = run[3]
    assert any("present only in validation" in w and "triangle" in w for w in warned)
    assert sum("training from scratch (no pretrained weights) for 2 epochs" in w for w in warned) == 1
    assert any("more epochs" in w and "higher learning rate" in w for w in warned)


def test_epochs_are_counted_from_one_with_the_time_left(run):
    _, messages, bars, _ = run
    summaries = [m for m in messages if m.startswith("epoch ")]
    assert [s.split(":")[0] for s in summaries] == ["epoch 1/2", "epoch 2/2"]
    assert "; run left ~" in summaries[0] and "run left" not in summaries[1]
    assert "epoch 1/2" in bars and "epoch 2/2" in bars and "Epoch 0" not in bars
    assert "run left=~" in bars


def test_metrics_csv_has_one_row_per_epoch(run):
    rows = read_rows(run[0])
    assert [row["epoch"] for row in rows] == ["0", "1"]
    header = list(rows[0])
    assert header[:2] == ["epoch", "step"]
    assert header.index("train/loss") < header.index("val/mAP_50_95")  # training values, then validation
    for row in rows:
        assert float(row["train/loss"]) > 0 and 0 <= float(row["val/mAP_50_95"]) <= 1
    assert [int(row["step"]) for row in rows] == [4, 9]  # the last step of each epoch (0-based)


def test_results_png_draws_losses_and_metrics(run):
    output = run[0]
    picture = output / "plots" / "results.png"
    with Image.open(picture) as image:
        assert image.format == "PNG" and image.width >= 800
    titles = [title for title, _ in panels(read_epochs(output / "metrics.csv"))]
    assert titles[0] == "loss" and {"loss_ce", "loss_bbox", "loss_giou", "mAP 50:95", "mAP 50"} <= set(titles)
    lines = dict(panels(read_epochs(output / "metrics.csv")))["mAP 50:95"]
    assert lines == {"val/ema_mAP_50_95": "val (EMA weights)"}  # the live weights were not scored apart
    assert not any(title.endswith(("_aux", "_enc")) for title in titles)


def test_files_follow_the_umask(run):
    files = [path for path in run[0].rglob("*") if path.is_file()]
    assert {"last.ckpt", "checkpoint_best_total.pth", "metrics.csv", "training_config.json", "results.png"} <= {
        path.name for path in files}
    assert {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in files} == {
        path.name: oct(0o666 & ~UMASK) for path in files}


def test_resume_keeps_earlier_rows_once(run, data, tmp_path):
    output = tmp_path / "resumed"
    output.mkdir()
    for path in run[0].iterdir():
        if path.is_file():
            (output / path.name).write_bytes(path.read_bytes())
    before = read_rows(run[0])
    train_and_capture(output, dataset_dir=str(data), epochs=3, resume="last", progress_bar=None)
    assert (run[0] / "plots" / "train_batch1.png").is_file()
    assert not list((output / "plots").glob("train_batch*"))  # drawn in epoch 0 only, not again on resume
    rows = read_rows(output)
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]
    for old, new in zip(before, rows):
        assert float(new["val/mAP_50_95"]) == float(old["val/mAP_50_95"])
        assert float(new["train/loss"]) == float(old["train/loss"])


def test_dont_save_weights_keeps_only_the_best_weights(data, tmp_path):
    messages, _, _ = train_and_capture(tmp_path, dataset_dir=str(data), epochs=1, dont_save_weights=True,
                                       progress_bar=None)
    names = {path.name for path in tmp_path.iterdir()}
    assert "checkpoint_best_total.pth" in names and "metrics.csv" in names
    assert not any(name.endswith(".ckpt") for name in names)
    assert "last.ckpt" not in next(m for m in messages if m.startswith("run:"))


def test_class_warnings_and_scales_and_durations():
    from collections import Counter

    with pytest.warns(UserWarning) as caught:
        warn_about_classes(["a", "b", "c"], Counter({0: 3}), Counter({0: 1, 1: 2}))
    texts = [str(w.message) for w in caught]
    assert any("present only in validation" in t and ": b." in t for t in texts)
    assert any("no training instances (nor validation ones): c;" in t for t in texts)
    assert scales_used(384, 32, "per-sample", True).startswith("384 px; multi-scale per-sample: 224 to 544 px")
    assert scales_used(384, 32, "off", True) == "384 px (multi-scale off); validation 384 px"
    assert [format_duration(s) for s in (45, 200, 3720)] == ["45s", "3m20s", "1h02m"]


def test_read_epochs_counts_from_one(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train/loss,val/mAP_50_95\n0,4,2.5,0.1\n1,9,2.0,\n")
    assert read_epochs(path) == {"train/loss": [(1, 2.5), (2, 2.0)], "val/mAP_50_95": [(1, 0.1)]}
