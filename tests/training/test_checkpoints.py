"""Checkpoint files, exact resume (also after a kill), lightweight resume and resume errors."""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import detrkit
from detrkit import RFDETRNano
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.models.weights import CheckpointError
from detrkit.training.checkpoints import AtomicCheckpointIO, save_atomically

FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)
STEPS_PER_EPOCH = 5  # 6 training images, batch 2: the tiny-set minimum of 5 steps applies


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=3,
                                  num_test=2, image_size=(96, 64), seed=0)


def fresh_model(tiny: dict, **overrides) -> RFDETRNano:
    torch.manual_seed(0)  # the same initial weights for every run that is compared
    return RFDETRNano(**{**tiny, **overrides})


@pytest.fixture(scope="module")
def two_epochs(data, tmp_path_factory) -> Path:
    from tiny_config import TINY

    output = tmp_path_factory.mktemp("two_epochs")
    fresh_model(TINY).train(dataset_dir=str(data), output_dir=str(output), epochs=2, checkpoint_interval=1, **FAST)
    return output


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert a["epoch"] == b["epoch"] and a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    ema_a, ema_b = a["callbacks"]["EMA"], b["callbacks"]["EMA"]
    assert ema_a["updates"] == ema_b["updates"]
    for key in ema_a["weights"]:
        assert torch.equal(ema_a["weights"][key], ema_b["weights"][key]), key
    moments_a = a["optimizer_states"][0]["state"]
    moments_b = b["optimizer_states"][0]["state"]
    for index in moments_a:
        assert torch.equal(moments_a[index]["exp_avg_sq"], moments_b[index]["exp_avg_sq"])


def metric_epochs(output: Path) -> list[int]:
    with open(output / "metrics.csv", newline="") as stream:
        return sorted({int(row["epoch"]) for row in csv.DictReader(stream) if row.get("val/mAP_50_95")})


def test_default_files_and_their_contents(two_epochs):
    names = sorted(p.name for p in two_epochs.iterdir())
    assert names == ["checkpoint_0.ckpt", "checkpoint_1.ckpt", "checkpoint_best_ema.pth", "checkpoint_best_total.pth",
                     "last.ckpt", "last_ema.pth", "metrics.csv", "plots", "training_config.json"]
    last = load(two_epochs / "last.ckpt")
    assert last["epoch"] == 1 and last["global_step"] == 2 * STEPS_PER_EPOCH
    assert last["model_name"] == "RFDETRNano" and last["class_names"] == ["circle", "square", "triangle"]
    assert last["args"]["epochs"] == 2 and last["model_config"]["num_classes"] == 5
    assert {"torch", "python", "numpy"} <= set(last["rng_states"])
    assert last["callbacks"]["EMA"]["updates"] == 2 * STEPS_PER_EPOCH
    assert last["RFDETRDataModule"]["sample_seed"] == 0
    total = load(two_epochs / "checkpoint_best_total.pth")
    assert total["best_total_source"] == "ema"  # the live weights were never scored
    assert not total["optimizer_states"] if "optimizer_states" in total else True
    last_ema = load(two_epochs / "last_ema.pth")
    for key, value in last_ema["model"].items():  # the EMA file holds the final average
        assert torch.equal(value, last["callbacks"]["EMA"]["weights"][key]), key
    assert last_ema["epoch"] == 1 and last_ema["detrkit_version"] == detrkit.__version__
    config = json.loads((two_epochs / "training_config.json").read_text())
    assert config["train_config"]["epochs"] == 2 and config["num_classes"] == 3


def test_files_store_each_tensor_once(two_epochs):
    weights = load(two_epochs / "last_ema.pth")["model"]
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    # the EMA state inside the EMA file is the same tensors as "model": stored once (a second copy
    # would make it at least twice the weights; the rest is per-tensor overhead and metadata)
    assert os.path.getsize(two_epochs / "last_ema.pth") < 1.3 * weight_bytes
    assert os.path.getsize(two_epochs / "checkpoint_best_total.pth") < 1.3 * weight_bytes
    # live weights + EMA + Adam's two moments, no fifth copy
    assert os.path.getsize(two_epochs / "last.ckpt") < 4.6 * weight_bytes


def test_lightweight_files_load_as_models(two_epochs, tiny_kwargs):
    for name in ("checkpoint_best_total.pth", "last_ema.pth", "checkpoint_best_ema.pth", "last.ckpt"):
        rebuilt = detrkit.from_checkpoint(str(two_epochs / name))
        assert type(rebuilt) is RFDETRNano and rebuilt.class_names == ["circle", "square", "triangle"]
        assert rebuilt.model_config.hidden_dim == tiny_kwargs["hidden_dim"]
    weights = load(two_epochs / "checkpoint_best_total.pth")["model"]
    warm = RFDETRNano(**{**tiny_kwargs, "pretrain_weights": str(two_epochs / "checkpoint_best_total.pth")})
    assert warm.model.num_classes == 5
    for key, value in warm.model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_resumed_run_is_bit_identical(data, two_epochs, tmp_path, tiny_kwargs):
    output = tmp_path / "resumed"
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1, checkpoint_interval=1,
                                   **FAST)
    # another initialisation: everything must come from the checkpoint
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=2, checkpoint_interval=1,
                                    resume=str(output / "last.ckpt"), **FAST)
    assert_same_training_state(load(two_epochs / "last.ckpt"), load(output / "last.ckpt"))
    assert metric_epochs(output) == [0, 1]  # the first run's rows survive the resume
    config = json.loads((output / "training_config.json").read_text())
    assert config["train_config"]["resume"] == str(output / "last.ckpt")


KILLED_RUN = """
import os, signal, sys, torch
import pytorch_lightning as pl
sys.path.insert(0, {tests!r})
from tiny_config import TINY
from detrkit import RFDETRNano

class Kill(pl.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)

torch.manual_seed(0)
RFDETRNano(**TINY).train(dataset_dir={data!r}, output_dir={output!r}, epochs=2, checkpoint_interval=1,
                         batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, seed=0,
                         callbacks=[Kill()])
"""


def test_run_killed_mid_epoch_resumes_to_the_same_weights(data, two_epochs, tmp_path, tiny_kwargs):
    output = tmp_path / "killed"
    script = KILLED_RUN.format(tests=str(Path(__file__).parents[1]), data=str(data), output=str(output),
                               kill_at=STEPS_PER_EPOCH + 2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    finished = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                              timeout=600)
    assert finished.returncode == -signal.SIGKILL, finished.stderr.decode()[-2000:]
    assert load(output / "last.ckpt")["epoch"] == 0  # epoch 1 was cut short
    assert not list(output.glob(".*.tmp"))
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=2, checkpoint_interval=1,
                                    resume="last", **FAST)
    assert_same_training_state(load(two_epochs / "last.ckpt"), load(output / "last.ckpt"))


def test_lightweight_resume_restores_weights_and_warns(data, two_epochs, tmp_path, tiny_kwargs):
    source = load(two_epochs / "last_ema.pth")
    seen = {}

    import pytorch_lightning as pl

    class FirstStep(pl.Callback):
        def on_train_start(self, trainer, module):
            seen["epoch"] = trainer.current_epoch
            seen["weights"] = {k: v.clone() for k, v in module.model.state_dict().items()}
            seen["ema_updates"] = module.ema.updates

    output = tmp_path / "light"
    with pytest.warns(UserWarning, match="optimizer and LR scheduler start cold.*best-score tracking restarts"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=3,
                                        resume=str(two_epochs / "last_ema.pth"), callbacks=[FirstStep()], **FAST)
    assert seen["epoch"] == 2  # continues after the file's last epoch
    assert seen["ema_updates"] == 2 * STEPS_PER_EPOCH
    for key, value in source["model"].items():
        assert torch.equal(seen["weights"][key], value), key
    assert metric_epochs(output) == [2]


def test_lightweight_resume_keeps_best_scores_in_its_own_directory(data, tmp_path, tiny_kwargs):
    output = tmp_path / "same"
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1, **FAST)
    best_before = load(output / "checkpoint_best_ema.pth")["callbacks"]["BestModels"]["best"]
    with pytest.warns(UserWarning, match="start cold") as caught:
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=2,
                                        resume=str(output / "last_ema.pth"), **FAST)
    assert not any("best-score tracking restarts" in str(w.message) for w in caught)
    best_after = load(output / "last_ema.pth")["callbacks"]["BestModels"]["best"]
    assert best_after["ema"] >= best_before["ema"]


def test_resume_errors_name_the_file_before_anything_is_written(data, two_epochs, tmp_path, tiny_kwargs):
    output = tmp_path / "never"
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1,
                                        resume=str(tmp_path / "nope.ckpt"), **FAST)
    with pytest.raises(CheckpointError, match=r"last.ckpt was trained with 5 classes but this run has 7"):
        RFDETRNano(**{**tiny_kwargs, "num_classes": 7}).train(
            dataset_dir=str(data), output_dir=str(output), epochs=1, resume=str(two_epochs / "last.ckpt"), **FAST)
    with pytest.raises(CheckpointError, match="another architecture"):
        RFDETRNano(**{**tiny_kwargs, "hidden_dim": 48}).train(
            dataset_dir=str(data), output_dir=str(output), epochs=1, resume=str(two_epochs / "last.ckpt"), **FAST)
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes((two_epochs / "last.ckpt").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="corrupt.ckpt"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1,
                                        resume=str(corrupt), **FAST)
    assert not output.exists()


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "last.ckpt"
    save_atomically({"a": torch.ones(3)}, path)

    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        AtomicCheckpointIO().save_checkpoint({"a": torch.zeros(3), "b": Unsaveable()}, path)
    assert torch.equal(load(path)["a"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
