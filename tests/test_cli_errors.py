"""User errors on the command line: one short message in CLI terms, exit status 2, tracebacks on request."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from detrkit import RFDETRNano, cli
from detrkit.config import ModelConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.models.download import WeightsDownloadError, resolve_weights
from detrkit.variants import VARIANTS

SRC = Path(__file__).parent.parent / "src"


@pytest.fixture
def tiny_nano(monkeypatch, tiny_kwargs):
    """The tiny architecture behind "--model nano": the command line is under test, not the model."""
    monkeypatch.setitem(VARIANTS, "nano", lambda **kwargs: RFDETRNano(**{**tiny_kwargs, **kwargs}))


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """An empty weights cache and a mirror that refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DETRKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DETRKIT_WEIGHTS_URL", f"http://127.0.0.1:{port}")
    for bypass in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(bypass, "*")
    monkeypatch.delenv("DETRKIT_DEBUG", raising=False)
    return tmp_path / "cache"


def train(*extra: str, dataset: str = "missing") -> list[str]:
    return ["train", "--dataset", dataset, "--weights", "none", "--device", "cpu", *extra]


def assert_short(err: str) -> None:
    assert err.startswith("detrkit train: error: ") and "Traceback" not in err
    assert "errors.pydantic.dev" not in err and "For further information" not in err and "type=" not in err
    assert len(err.strip().splitlines()) <= 3


def test_missing_dataset_is_one_message_and_status_2(tiny_nano, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DETRKIT_DEBUG", raising=False)
    assert cli.main(train(dataset=str(tmp_path / "nowhere"))) == 2
    err = capsys.readouterr().err
    assert_short(err)
    assert f"dataset_dir {tmp_path / 'nowhere'} does not exist" in err and "--dataset" in err


def test_folder_of_unknown_format_names_the_files_looked_for(tiny_nano, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(train(dataset=str(tmp_path / "empty"))) == 2
    err = capsys.readouterr().err
    assert_short(err)
    assert "cannot tell the format" in err and "data.yaml" in err


def test_unknown_set_key_suggests_the_nearest(tiny_nano, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(train("--set", "epoch=3"))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert_short(err)
    assert "--set epoch=...: unknown setting (did you mean epochs" in err


def test_invalid_resolution_names_the_nearest_valid_sides(tiny_nano, capsys):
    # the tiny model has 16 px patches in 2x2 windows: sides are multiples of 32, as for Nano
    assert cli.main(train("--resolution", "250")) == 2
    err = capsys.readouterr().err
    assert_short(err)
    assert "resolution=250 must be divisible by patch_size*num_windows=32; nearest valid: 256 or 224" in err


def test_invalid_values_are_listed_with_their_nearest_valid_ones(tiny_nano, tmp_path, capsys):
    data = make_synthetic_dataset(tmp_path / "data", num_train=2, num_valid=1, image_size=(64, 64))
    assert cli.main(train("--set", "multi_scale=per_batch", "--set", "warmup_epochs=-1", dataset=str(data))) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "errors.pydantic.dev" not in err
    assert "multi_scale='per_batch': input should be 'off', 'per-batch' or 'per-sample' (did you mean 'per-batch'?)" in err
    assert "warmup_epochs=-1: input should be greater than or equal to 0 (smallest valid: 0)" in err
    assert "detrkit train --help" in err
    assert not (tmp_path / "output").exists()


def test_offline_weights_speak_the_command_line(offline, capsys):
    assert cli.main(["train", "--dataset", "unused", "--model", "nano"]) == 2
    err = capsys.readouterr().err
    assert_short(err)
    assert "could not download" in err and "--weights none" in err and "--weights PATH" in err
    assert "pretrain_weights" not in err and str(offline / "rf-detr-nano.pth") in err


def test_offline_weights_speak_python_with_one_traceback(offline):
    with pytest.raises(WeightsDownloadError) as caught:
        resolve_weights("rf-detr-nano.pth")
    assert "pretrain_weights=None" in str(caught.value) and "--weights" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # not two chained tracebacks


def test_debug_flag_and_variable_show_the_traceback(tiny_nano, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cli.main(train("--debug", dataset=str(tmp_path / "nowhere")))
    monkeypatch.setenv("DETRKIT_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cli.main(train(dataset=str(tmp_path / "nowhere")))


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    def broken(**kwargs):
        raise ValueError("a bug, not the user's")  # raised outside detrkit's checks

    monkeypatch.setitem(VARIANTS, "nano", broken)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(train())


def test_python_errors_suggest_the_nearest_valid_values():
    with pytest.raises(ValidationError, match="nearest valid: 256 or 224"):
        ModelConfig(resolution=250)
    with pytest.raises(ValidationError, match=r"did you mean `epochs`"):
        RFDETRNano(pretrain_weights=None, encoder_layers=1, out_feature_indexes=[1]).get_train_config(epoch=3)


def test_the_installed_command_exits_with_status_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "DETRKIT_DEBUG": "0"}
    done = subprocess.run([sys.executable, "-m", "detrkit.cli", *train("--set", "epoch=3")], check=False,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "did you mean epochs" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_in_training_prints_where_to_resume_and_exits_130(tiny_nano, tmp_path, capsys, monkeypatch):
    from detrkit.training.callbacks.interrupt import TrainingInterrupted

    message = "training interrupted (Ctrl-C) after step 8 (epoch 2/2, batch 3/5). out/last.ckpt holds this point"

    def interrupted(self, **kwargs):
        raise TrainingInterrupted(message)

    monkeypatch.setattr(RFDETRNano, "train", interrupted)
    assert cli.main(train(dataset=str(tmp_path))) == cli.INTERRUPTED_STATUS == 130
    err = capsys.readouterr().err
    assert err == f"detrkit train: {message}\n"
