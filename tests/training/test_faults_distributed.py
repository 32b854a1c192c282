"""DDP on CPU (gloo) where one process gets no validation or test batch: fewer images than
processes (reference #1085) must neither deadlock nor change the metrics, and run_test=True at the
end of such a fit must not hang (reference #1505). A NaN loss on one process stops every process
with the same message naming that process's batch; with skip_nonfinite_steps all of them skip it
and end with the same weights. Ctrl-C on one process stops both at the same step with last.ckpt
written there, and the resumed run ends as an uninterrupted one.

Every launch has a timeout: a hang is a failure.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detrkit.datasets.synthetic import make_synthetic_dataset

SCRIPT = Path(__file__).with_name("ddp_run.py")
TIMEOUT = 420


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """One validation and one test image: the second process has none of either."""
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=1,
                                  num_test=1, image_size=(96, 64), seed=0)


STEPS_PER_EPOCH = 5  # 4 training images, 2 processes x batch 1: the tiny-set minimum of 5 steps


def launch(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def read_rank(output: Path, rank: int) -> dict:
    return json.loads((output / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("ddp")
    launch("train", str(data), str(output), "--devices", "2", "--batch-size", "1")  # run_test=True
    return output


def test_fit_and_run_test_finish_when_a_process_has_no_batches(fitted):
    with open(fitted / "metrics.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert sorted(int(r["epoch"]) for r in rows if r.get("val/mAP_50_95")) == [0, 1]
    assert [r for r in rows if r.get("test/mAP_50_95")]  # the test after fit ran, and did not hang
    assert (fitted / "checkpoint_best_total.pth").is_file()


def test_validation_with_an_idle_process_equals_one_process(data, fitted, tmp_path):
    weights = str(fitted / "checkpoint_best_total.pth")
    launch("validate", str(data), str(tmp_path / "one"), "--devices", "1", "--weights", weights)
    launch("validate", str(data), str(tmp_path / "two"), "--devices", "2", "--weights", weights)
    single = json.loads((tmp_path / "one" / "rank0.json").read_text())["metrics"]
    assert "val/mAP_50_95" in single and "val/mAR" in single
    for rank in (0, 1):  # the process without a batch logs the same numbers
        assert json.loads((tmp_path / "two" / f"rank{rank}.json").read_text())["metrics"] == single


def test_nan_loss_on_one_process_stops_both_naming_its_batch(data, tmp_path):
    launch("nonfinite", str(data), str(tmp_path), "--devices", "2", "--poison", "1,1,2")
    ids = read_rank(tmp_path, 1)["poisoned"]["1,2"]
    assert read_rank(tmp_path, 0)["poisoned"] == {}  # the NaN was on process 1 only
    expected = (f"non-finite training loss at epoch 1, step {STEPS_PER_EPOCH + 2} (batch 2 of the epoch), "
                f"image ids {ids} on process 1. Nothing after the last checkpoint was saved")
    for rank in (0, 1):  # both stopped (neither hung in an all-reduce), with the same message
        assert expected in read_rank(tmp_path, rank)["error"]
    last = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["epoch"] == 0 and last["global_step"] == STEPS_PER_EPOCH  # the last good one
    assert all(torch.isfinite(value.float()).all() for value in last["state_dict"].values())
    assert not (tmp_path / "checkpoint_1.ckpt").exists()


def test_skip_nonfinite_steps_skips_together_and_ranks_end_identical(data, tmp_path):
    # a NaN on process 1 in epoch 0 and on process 0 in epoch 1, both skipped
    launch("nonfinite", str(data), str(tmp_path), "--devices", "2", "--skip-nonfinite", "2",
           "--poison", "1,0,3", "--poison", "0,1,1")
    for rank in (0, 1):
        assert read_rank(tmp_path, rank)["error"] is None
    finals = [torch.load(tmp_path / f"final{rank}.pt", weights_only=True) for rank in (0, 1)]
    for final in finals:
        assert final["global_step"] == 2 * STEPS_PER_EPOCH
        assert final["adam_steps"] == [2 * STEPS_PER_EPOCH - 2]  # the two skipped steps moved no weight or moment
        assert final["ema_updates"] == 2 * STEPS_PER_EPOCH  # the EMA takes every step, as with one process
    for track in ("live", "ema"):
        for key, value in finals[0][track].items():
            assert torch.equal(value, finals[1][track][key]), (track, key)
            assert torch.isfinite(value.float()).all(), (track, key)
    last = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["callbacks"]["NonFiniteLossGuard"] == {"skipped": 2}


def metrics_rows(output: Path) -> list[dict[str, str]]:
    with open(output / "metrics.csv", newline="") as stream:
        return list(csv.DictReader(stream))


def test_ctrl_c_on_one_process_stops_both_at_one_step_and_resumes_exactly(data, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    launch("interrupt", str(data), str(whole), "--devices", "2")
    launch("interrupt", str(data), str(cut), "--devices", "2", "--ctrl-c", "1,1,2")  # process 1 only
    expected = (f"training interrupted (Ctrl-C) after step {STEPS_PER_EPOCH + 3} (epoch 2/2, batch 3/"
                f"{STEPS_PER_EPOCH}). {cut}/last.ckpt holds this point")
    for rank in (0, 1):  # both stopped after the same step (neither hung in a collective)
        assert expected in read_rank(cut, rank)["error"]
    launch("interrupt", str(data), str(cut), "--devices", "2", "--resume")
    for rank in (0, 1):
        assert read_rank(cut, rank)["error"] is None
    uninterrupted, resumed = (torch.load(d / "last.ckpt", map_location="cpu", weights_only=True) for d in (whole, cut))
    assert resumed["global_step"] == uninterrupted["global_step"] == 2 * STEPS_PER_EPOCH
    for key, value in uninterrupted["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    for key, value in uninterrupted["callbacks"]["EMA"]["weights"].items():
        assert torch.equal(value, resumed["callbacks"]["EMA"]["weights"][key]), key
    # train/* means reduced over both processes: the cut epoch's include the part before the cut
    assert metrics_rows(cut) == metrics_rows(whole)
