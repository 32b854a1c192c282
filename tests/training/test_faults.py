"""Injected faults end in a clear message with nothing lost: a non-finite loss, a full or read-only
disk while a checkpoint is written, a kill mid-write, a sample that fails to load (also in a loader
worker), a loader worker killed by a signal, an image deleted or truncated during training, and Ctrl-C.

Subprocess runs have timeouts: a hang is a failure.
"""

import csv
import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

import detrkit
from detrkit import RFDETRNano
from detrkit.datasets.detection import SampleLoadError
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.datasets.worker_deaths import SampleWorkerKilled
from detrkit.training import checkpoints
from detrkit.training.callbacks.nonfinite import NonFiniteLossError
from detrkit.training.checkpoints import CheckpointWriteError

FAST = {"batch_size": 2, "num_workers": 0, "progress_bar": None, "tensorboard": False, "seed": 0,
        "checkpoint_interval": 1}
STEPS_PER_EPOCH = 5  # 6 training images, batch 2: the tiny-set minimum of 5 steps
TIMEOUT = 600
TESTS = str(Path(__file__).parents[1])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=2,
                                  num_test=0, image_size=(96, 64), seed=0)


def fresh_model(tiny: dict) -> RFDETRNano:
    torch.manual_seed(0)
    return RFDETRNano(**tiny)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> dict:
    """last.ckpt and metrics.csv rows of an uninterrupted two-epoch run: what every resumed run must end with."""
    from tiny_config import TINY

    output = tmp_path_factory.mktemp("uninterrupted")
    fresh_model(TINY).train(dataset_dir=str(data), output_dir=str(output), epochs=2, **FAST)
    return {"last": load(output / "last.ckpt"), "metrics": metrics_rows(output)}


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["epoch"] == b["epoch"] and a["global_step"] == b["global_step"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for key, value in a["callbacks"]["EMA"]["weights"].items():
        assert torch.equal(value, b["callbacks"]["EMA"]["weights"][key]), key


def assert_good_checkpoint(path: Path, epoch: int) -> None:
    checkpoint = load(path)
    assert checkpoint["epoch"] == epoch
    assert all(torch.isfinite(v.float()).all() for v in checkpoint["state_dict"].values())
    assert type(detrkit.from_checkpoint(str(path))) is RFDETRNano


class Poison(pl.Callback):
    """Sets one pixel (or all) of the batch to NaN at the given (epoch, batch index) steps; records image ids."""

    def __init__(self, *steps: tuple[int, int], every_pixel: bool = False) -> None:
        self.steps, self.image_ids, self.every_pixel = set(steps), {}, every_pixel

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) in self.steps:
            if self.every_pixel:
                batch.pixels.fill_(float("nan"))
            else:
                batch.pixels[0, 0, 0, 0] = float("nan")
            self.image_ids[trainer.current_epoch, batch_idx] = [t.image_id for t in batch.targets]


def test_non_finite_loss_stops_naming_epoch_step_and_images(data, tmp_path, tiny_kwargs):
    poison = Poison((1, 2))
    with pytest.raises(NonFiniteLossError) as raised:
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2,
                                       callbacks=[poison], **FAST)
    ids = poison.image_ids[1, 2]
    assert f"at epoch 1, step {STEPS_PER_EPOCH + 2} (batch 2 of the epoch), image ids {ids}" in str(raised.value)
    assert "skip_nonfinite_steps=N" in str(raised.value)
    assert_good_checkpoint(tmp_path / "last.ckpt", epoch=0)  # the last good one, untouched
    assert not (tmp_path / "checkpoint_1.ckpt").exists()


def test_skip_nonfinite_steps_skips_with_a_warning(data, tmp_path, tiny_kwargs):
    with pytest.warns(UserWarning, match=r"at epoch 0, step 3 .*skipping this step \(1 of skip_nonfinite_steps=1\)"):
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "one"), epochs=2,
                                       skip_nonfinite_steps=1, callbacks=[Poison((0, 3))], **FAST)
    last = load(tmp_path / "one" / "last.ckpt")
    # the poisoned batch had no backward: AdamW skipped every weight (the step counter still moves)
    moments = last["optimizer_states"][0]["state"]
    assert {int(state["step"]) for state in moments.values()} == {2 * STEPS_PER_EPOCH - 1}
    assert_good_checkpoint(tmp_path / "one" / "last.ckpt", epoch=1)
    with pytest.raises(NonFiniteLossError, match=r"at epoch 1, step 7 .*more than skip_nonfinite_steps=1"):
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "two"), epochs=2,
                                       skip_nonfinite_steps=1, callbacks=[Poison((0, 3), (1, 2))], **FAST)


def test_keypoint_models_skip_micro_batches_and_drop_a_window_with_none_left(tmp_path):
    from ddp_keypoints import EXACT, keypoint_data, keypoint_model

    data = keypoint_data(tmp_path / "data")
    settings = {**EXACT, "optimizer": "adamw", "batch_size": 1, "grad_accum_steps": 2, "skip_nonfinite_steps": 3}
    # window 1 (batches 2, 3) keeps batch 2; window 2 (batches 4, 5) has nothing left and takes no step
    with pytest.warns(UserWarning, match=r"skipping this step \(3 of skip_nonfinite_steps=3\)"):
        keypoint_model().train(dataset_dir=str(data), output_dir=str(tmp_path / "out"),
                               callbacks=[Poison((0, 3), (0, 4), (0, 5), every_pixel=True)], **settings)
    last = load(tmp_path / "out" / "last.ckpt")
    assert last["global_step"] == STEPS_PER_EPOCH
    assert {int(state["step"]) for state in last["optimizer_states"][0]["state"].values()} == {STEPS_PER_EPOCH - 1}
    assert all(torch.isfinite(value.float()).all() for value in last["state_dict"].values())
    with open(tmp_path / "out" / "metrics.csv") as stream:
        header, row = stream.readline().strip().split(","), stream.readline().strip().split(",")
    assert float(row[header.index("train/loss")]) > 0  # the mean of the kept batches: no NaN logged


def file_of(stream) -> str:
    """The path of an open file (the atomic writer opens its temporary file from a descriptor)."""
    return os.readlink(f"/proc/self/fd/{stream.fileno()}") if hasattr(stream, "fileno") else ""


class Arm(pl.Callback):
    """Sets `state["armed"]` when the given epoch starts."""

    def __init__(self, state: dict, epoch: int) -> None:
        self.state, self.epoch = state, epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.state["armed"] = trainer.current_epoch >= self.epoch


@pytest.mark.parametrize("fault", ["disk_full", "read_only"])
def test_checkpoint_write_failure_names_the_file_and_keeps_the_previous(fault, data, uninterrupted, tmp_path,
                                                                       tiny_kwargs, monkeypatch):
    state = {"armed": False}
    real_save, real_create = torch.save, checkpoints.create_temporary

    def full_disk_save(payload, stream, *args, **kwargs):
        if state["armed"] and ".last.ckpt." in file_of(stream):
            stream.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(payload, stream, *args, **kwargs)

    def read_only_create(folder, prefix, suffix):
        if state["armed"] and prefix.startswith(".last.ckpt"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_create(folder, prefix, suffix)

    if fault == "disk_full":
        monkeypatch.setattr(checkpoints.torch, "save", full_disk_save)
    else:
        monkeypatch.setattr(checkpoints, "create_temporary", read_only_create)
    reason = os.strerror(errno.ENOSPC if fault == "disk_full" else errno.EROFS)
    with pytest.raises(CheckpointWriteError, match=rf"could not write {tmp_path}/last.ckpt \({reason}\); the "
                                                   rf"previous file is intact and no partial file was left behind"):
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2,
                                       callbacks=[Arm(state, 1)], **FAST)
    assert sorted(p.name for p in tmp_path.glob(".*")) == []  # no temporary file left
    assert_good_checkpoint(tmp_path / "last.ckpt", epoch=0)
    state["armed"] = False  # space freed: the resume ends where an uninterrupted run ends
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, resume="last",
                                    **FAST)
    assert_same_weights(uninterrupted["last"], load(tmp_path / "last.ckpt"))


KILLED_WRITE = """
import os, signal, sys, torch
sys.path.insert(0, {tests!r})
from tiny_config import TINY
import detrkit.training.checkpoints as checkpoints
from detrkit import RFDETRNano

real_save = torch.save
def dying_save(payload, stream, *args, **kwargs):
    name = os.readlink(f"/proc/self/fd/{{stream.fileno()}}")
    if ".last.ckpt." in name and payload.get("epoch") == 1:
        real_save(payload, stream, *args, **kwargs)
        stream.flush()
        os.truncate(name, os.path.getsize(name) // 2)  # half the file on disk, then the kill
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(payload, stream, *args, **kwargs)
checkpoints.torch.save = dying_save

torch.manual_seed(0)
RFDETRNano(**TINY).train(dataset_dir={data!r}, output_dir={output!r}, epochs=2, checkpoint_interval=1,
                         batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, seed=0)
"""


def run_script(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def test_killed_while_writing_last_resumes_from_the_previous_checkpoint(data, uninterrupted, tmp_path, tiny_kwargs):
    done = run_script(KILLED_WRITE.format(tests=TESTS, data=str(data), output=str(tmp_path)))
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    partial = list(tmp_path.glob(".last.ckpt.*.tmp"))
    assert len(partial) == 1  # the half-written file, beside the intact previous one
    assert_good_checkpoint(tmp_path / "last.ckpt", epoch=0)
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, resume="last",
                                    **FAST)
    assert not partial[0].exists()  # cleared when the resumed run started
    assert_same_weights(uninterrupted["last"], load(tmp_path / "last.ckpt"))


class DamageImage(pl.Callback):
    """After epoch 0, deletes or truncates one training image."""

    def __init__(self, path: Path, how: str) -> None:
        self.path, self.how = path, how

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0:
            if self.how == "delete":
                self.path.unlink()
            else:
                self.path.write_bytes(self.path.read_bytes()[:100])


@pytest.mark.parametrize("how, workers", [("delete", 0), ("truncate", 0), ("truncate", 1)])
def test_image_damaged_during_training_is_named(how, workers, data, tmp_path, tiny_kwargs):
    copy = tmp_path / "data"
    make_synthetic_dataset(copy, num_train=6, num_valid=2, num_test=0, image_size=(96, 64), seed=0)
    import json

    images = json.loads((copy / "train" / "_annotations.coco.json").read_text())["images"]
    victim = images[3]
    path = copy / "train" / victim["file_name"]
    settings = {**FAST, "num_workers": workers, "persistent_workers": False}
    with pytest.raises(SampleLoadError) as raised:
        fresh_model(tiny_kwargs).train(dataset_dir=str(copy), output_dir=str(tmp_path / "out"), epochs=2,
                                       callbacks=[DamageImage(path, how)], **settings)
    message = str(raised.value)
    assert f"sample 3 (image id {victim['id']}, file {path})" in message
    assert ("image file not found" if how == "delete" else "cannot decode image") in message
    assert_good_checkpoint(tmp_path / "out" / "last.ckpt", epoch=0)


def test_a_transform_failing_on_one_sample_names_it_in_a_worker(data, tmp_path, tiny_kwargs, monkeypatch):
    from detrkit.datasets import detection

    real = detection._to_target

    def failing(sample, image_id, *args, **kwargs):
        if image_id == 2:
            raise RuntimeError("bad polygon")
        return real(sample, image_id, *args, **kwargs)

    monkeypatch.setattr(detection, "_to_target", failing)  # loader workers are forked: they see it
    with pytest.raises(SampleLoadError, match=r"sample \d+ \(image id 2, file .*\) failed to load: "
                                              r"RuntimeError: bad polygon"):
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=1,
                                       **{**FAST, "num_workers": 1})


def test_a_worker_killed_by_a_signal_names_the_sample_it_was_loading(data, tmp_path, tiny_kwargs, monkeypatch):
    import json

    from detrkit.datasets import detection

    victim = 3  # a training sample: the data set's records follow the annotation file's order
    image = json.loads((data / "train" / "_annotations.coco.json").read_text())["images"][victim]
    armed, real = tmp_path / "armed", detection.DetectionDataset._sample

    def dying(self, index):
        worker = torch.utils.data.get_worker_info()
        if armed.exists() and worker is not None and self.records[index].path == data / "train" / image["file_name"]:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-sample, saying nothing
        return real(self, index)

    class Arm(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            armed.touch()  # after epoch 0, whose checkpoints are written

    monkeypatch.setattr(detection.DetectionDataset, "_sample", dying)  # loader workers are forked: they see it
    with pytest.raises(SampleWorkerKilled) as raised:
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "out"), epochs=2,
                                       callbacks=[Arm()], **{**FAST, "num_workers": 1})
    message = str(raised.value)
    assert isinstance(raised.value, SampleLoadError)
    assert (f") was killed by signal: Killed (SIGKILL) while loading data set sample {victim} (image id "
            f"{image['id']}, file {data / 'train' / image['file_name']})") in message
    assert "PyTorch said: DataLoader worker (pid" in message
    assert_good_checkpoint(tmp_path / "out" / "last.ckpt", epoch=0)
    assert_good_checkpoint(tmp_path / "out" / "checkpoint_0.ckpt", epoch=0)


INTERRUPTED = """
import os, signal, sys, torch
import pytorch_lightning as pl
sys.path.insert(0, {tests!r})
from tiny_config import TINY
from detrkit import RFDETRNano

class CtrlC(pl.Callback):
    fired = False

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == {at} and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)  # lands in the middle of this step

torch.manual_seed(0)
RFDETRNano(**TINY).train(dataset_dir={data!r}, output_dir={output!r}, epochs=2, checkpoint_interval=1,
                         batch_size=2, num_workers={workers}, progress_bar=None, tensorboard=False, seed=0,
                         callbacks=[CtrlC()], **{extra!r})
"""


def metrics_rows(output: Path) -> list[dict[str, str]]:
    with open(output / "metrics.csv", newline="") as stream:
        return list(csv.DictReader(stream))


# with a loader worker, the resumed run's first pass used to take epoch 0's order (its iterator
# started before Lightning's set_epoch); the order does not depend on the number of workers
@pytest.mark.parametrize("workers", [0, 1])
def test_ctrl_c_stops_after_the_step_writes_last_and_resumes_exactly(workers, data, uninterrupted, tmp_path,
                                                                     tiny_kwargs):
    at = STEPS_PER_EPOCH + 2  # epoch 1, batch 2: inside the epoch
    done = run_script(INTERRUPTED.format(tests=TESTS, data=str(data), output=str(tmp_path), at=at, workers=workers,
                                           extra={}))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    # the step finished, then last.ckpt was written for that point
    assert (f"training interrupted (Ctrl-C) after step {at + 1} (epoch 2/2, batch 3/{STEPS_PER_EPOCH}). "
            f"{tmp_path}/last.ckpt holds this point: resume with train(..., resume='last')") in output
    interrupted = load(tmp_path / "last.ckpt")
    assert interrupted["global_step"] == at + 1 and interrupted["interrupted_at"] == {"epoch": 1, "batch": 2,
                                                                                       "step": at + 1}
    assert interrupted["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 3}]
    assert type(detrkit.from_checkpoint(str(tmp_path / "last.ckpt"))) is RFDETRNano
    assert len(metrics_rows(tmp_path)) == 1  # epoch 0's row; the cut epoch has none yet
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, resume="last",
                                    **{**FAST, "num_workers": workers})
    assert_same_weights(uninterrupted["last"], load(tmp_path / "last.ckpt"))
    assert metrics_rows(tmp_path) == uninterrupted["metrics"]  # the cut epoch's train/* means too


ACCUMULATED = {"grad_accum_steps": 2, "compute_train_metrics": True, "train_log_on_step": True}


def test_ctrl_c_inside_an_accumulation_window_stops_when_it_closes(data, tmp_path, tiny_kwargs):
    """The stop waits for the window's last micro-batch (partial gradients are in no checkpoint);
    the per-step and per-epoch train/* logs and the training-set mAP of the cut epoch come back."""
    whole = tmp_path / "whole"
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(whole), epochs=2, **FAST, **ACCUMULATED)
    cut = tmp_path / "cut"
    # 20 samples an epoch (5 windows of 2 x 2): step 6 is epoch 1's second window, micro-batches 2 and 3
    done = run_script(INTERRUPTED.format(tests=TESTS, data=str(data), output=str(cut), at=6, workers=0,
                                         extra=ACCUMULATED))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "training interrupted (Ctrl-C) after step 7 (epoch 2/2, batch 4/10)." in output
    assert load(cut / "last.ckpt")["interrupted_at"] == {"epoch": 1, "batch": 3, "step": 7}
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(cut), epochs=2, resume="last", **FAST,
                                   **ACCUMULATED)
    assert_same_weights(load(whole / "last.ckpt"), load(cut / "last.ckpt"))
    rows = metrics_rows(cut)
    assert rows == metrics_rows(whole)
    assert {"train/loss_epoch", "train/mAP_50"} <= set(rows[1])


def test_ctrl_c_in_the_last_step_of_an_epoch_lets_it_finish(data, uninterrupted, tmp_path, tiny_kwargs):
    done = run_script(INTERRUPTED.format(tests=TESTS, data=str(data), output=str(tmp_path), at=STEPS_PER_EPOCH - 1,
                                         workers=0, extra={}))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "Ctrl-C: this epoch's validation and checkpoints come first, then training stops" in output
    assert (f"training interrupted (Ctrl-C) after epoch 1/2. {tmp_path}/last.ckpt holds that epoch: resume with "
            f"train(..., resume='last')") in output
    assert_good_checkpoint(tmp_path / "last.ckpt", epoch=0)
    assert "interrupted_at" not in load(tmp_path / "last.ckpt")
    assert (tmp_path / "checkpoint_best_ema.pth").is_file()  # the epoch was validated and ranked
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, resume="last", **FAST)
    assert_same_weights(uninterrupted["last"], load(tmp_path / "last.ckpt"))
    assert metrics_rows(tmp_path) == uninterrupted["metrics"]
