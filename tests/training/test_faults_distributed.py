"""DDP on CPU (gloo) where one process gets no validation or test batch: fewer images than
processes (reference #1085) must neither deadlock nor change the metrics, and run_test=True at the
end of such a fit must not hang (reference #1505).

Every launch has a timeout: a hang is a failure.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detrkit.datasets.synthetic import make_synthetic_dataset

SCRIPT = Path(__file__).with_name("ddp_run.py")
TIMEOUT = 420


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """One validation and one test image: the second process has none of either."""
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=1,
                                  num_test=1, image_size=(96, 64), seed=0)


def launch(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


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
