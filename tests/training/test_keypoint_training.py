"""Keypoint models train with manual optimisation (spec 7.7): a window of micro-batches, here or on
several gloo processes, trains as one batch of its images; clipping, the LR schedule, EMA and
checkpoints follow the optimizer steps; sharded strategies are refused before training.

Every launch has a timeout: a hang is a failure.
"""

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from ddp_keypoints import EXACT, keypoint_data, keypoint_model
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy
from pytorch_lightning.utilities.types import LRSchedulerConfig

from detrkit.config import KeypointTrainConfig, TrainConfig
from detrkit.training import RFDETRModelModule, build_trainer
from detrkit.training.callbacks.interrupt import TrainingInterrupted
from detrkit.training.datamodule import MIN_STEPS_PER_EPOCH
from detrkit.training.manual_step import ManualAccumulation, require_data_parallel, step_schedulers
from detrkit.training.sampling import EpochSampler

SCRIPT = Path(__file__).with_name("ddp_keypoints.py")
TIMEOUT = 600
WINDOWS = MIN_STEPS_PER_EPOCH  # optimizer steps per epoch: 6 images, 4 per window, the tiny-set minimum


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return keypoint_data(tmp_path_factory.mktemp("data") / "shapes")


def trained_weights(data: Path, output: Path, **settings) -> dict[str, torch.Tensor]:
    model = keypoint_model()
    model.train(dataset_dir=str(data), output_dir=str(output), **{**EXACT, **settings})
    return model.model.state_dict()


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[key].double() - b[key].double()).abs().max().item() for key in a)


@pytest.fixture(scope="module")
def batch_of_four(data, tmp_path_factory) -> dict[str, torch.Tensor]:
    """1 process x batch 4, no accumulation: what every accumulated run must end with."""
    return trained_weights(data, tmp_path_factory.mktemp("four"), batch_size=4)


def test_no_micro_batch_is_empty_on_every_process():
    # a micro-batch without boxes anywhere counts as 1 box (the normaliser's clamp, as in rfdetr),
    # so the comparisons below need every micro-batch to hold a box on some process: image 1 has none
    keys = [index for index, _ in EpochSampler(6, 0, 4, min_samples=WINDOWS * 4).global_keys()]
    windows = [keys[start:start + 4] for start in range(0, len(keys), 4)]
    assert len(windows) == WINDOWS
    for window in windows:
        one_process = [window[0:2], window[2:4]]  # batch 2 x accumulation 2
        two_processes = [[window[0], window[2]], [window[1], window[3]]]  # 2 x batch 1 x accumulation 2
        assert all(pair != [1, 1] for pair in one_process + two_processes), window
    assert 1 in keys and 0 in keys  # the image without boxes and the one without labelled keypoints train


def test_accumulated_windows_equal_one_batch(data, batch_of_four, tmp_path):
    accumulated = trained_weights(data, tmp_path, batch_size=2, grad_accum_steps=2)
    assert max_difference(accumulated, batch_of_four) < 1e-5
    moved = max_difference(batch_of_four, keypoint_model().model.state_dict())
    assert moved > 1e-3  # training moved the weights far beyond the tolerance: the comparison means something


def test_two_processes_equal_one_process(data, batch_of_four, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(SCRIPT), str(data), str(tmp_path), "--devices", "2", "--batch-size",
                           "1", "--accumulation", "2"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    main, other = (torch.load(tmp_path / f"weights{rank}.pt", weights_only=True) for rank in (0, 1))
    assert max_difference(main, other) == 0
    assert max_difference(main, batch_of_four) < 1e-5
    # 10 micro-batches per process: only the 5 backwards that close a window all-reduce
    for rank in (0, 1):
        assert json.loads((tmp_path / f"syncs{rank}.json").read_text()) == {"syncs": WINDOWS}


class ClipRecordingAdamW(torch.optim.AdamW):
    """AdamW that records the global gradient norm it steps with (after Lightning's hooks clipped it)."""

    def __init__(self, params, norms: list[float], **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.norms = norms

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()  # runs on_before_optimizer_step: the clipping
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        super().step()
        return loss


class UnclippedNorms(pl.Callback):
    """Callbacks see on_before_optimizer_step before the module clips."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())


class Crash(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 4:  # window [4, 5] half done
            raise RuntimeError("crash")


# the keypoint preset's own optimisation: AdamW, clipping at 0.1, EMA; a cosine ends at lr 0
PRESET = dict(epochs=2, batch_size=1, grad_accum_steps=2, lr_scheduler="cosine", multi_scale=False,
              clip_max_norm=0.1, num_workers=0, progress_bar=None, tensorboard=False, seed=0)


def train_preset(data: Path, output: Path, **settings) -> list[float]:
    norms: list[float] = []
    keypoint_model().train(dataset_dir=str(data), output_dir=str(output), **{**PRESET, **settings},
                           optimizer=functools.partial(ClipRecordingAdamW, norms=norms))
    return norms


@pytest.fixture(scope="module")
def preset_run(data, tmp_path_factory) -> tuple[Path, list[float], list[float]]:
    output, unclipped = tmp_path_factory.mktemp("preset"), UnclippedNorms()
    clipped = train_preset(data, output, callbacks=[unclipped])
    return output, clipped, unclipped.norms


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_clipping_schedule_and_ema_follow_optimizer_steps(preset_run):
    output, clipped, unclipped = preset_run
    steps = 2 * WINDOWS
    assert len(clipped) == len(unclipped) == steps
    assert max(unclipped) > 0.1 and max(clipped) <= 0.1 * (1 + 1e-5)  # global L2 norm clipped to clip_max_norm
    last = load(output / "last.ckpt")
    assert last["global_step"] == steps and last["callbacks"]["EMA"]["updates"] == steps
    scheduler = last["lr_schedulers"][0]
    assert scheduler["last_epoch"] == steps
    assert scheduler["_last_lr"] == [0.0] * len(scheduler["_last_lr"])  # the schedule spans exactly the steps


def assert_same_state(uninterrupted: dict, resumed: dict) -> None:
    assert uninterrupted["global_step"] == resumed["global_step"]
    # the resumed window's first micro-batch is no optimizer step: no extra average
    assert uninterrupted["callbacks"]["EMA"]["updates"] == resumed["callbacks"]["EMA"]["updates"]
    for key, value in uninterrupted["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][key]), key
    for key, value in uninterrupted["callbacks"]["EMA"]["weights"].items():
        assert torch.equal(value, resumed["callbacks"]["EMA"]["weights"][key]), key
    moments, resumed_moments = (c["optimizer_states"][0]["state"] for c in (uninterrupted, resumed))
    for index, state in moments.items():
        assert torch.equal(state["exp_avg_sq"], resumed_moments[index]["exp_avg_sq"]), index


def test_crash_mid_window_resumes_to_the_same_state(data, preset_run, tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        train_preset(data, tmp_path, callbacks=[Crash()])
    assert load(tmp_path / "last.ckpt")["epoch"] == 0
    train_preset(data, tmp_path, resume="last")  # repeats epoch 1, its windows at the same batches
    assert_same_state(load(preset_run[0] / "last.ckpt"), load(tmp_path / "last.ckpt"))


class CtrlC(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 2:  # the first micro-batch of window [2, 3]
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_mid_epoch_stops_when_the_window_closes_and_resumes_there(data, preset_run, tmp_path):
    with pytest.raises(TrainingInterrupted, match=r"after step 7 \(epoch 2/2, batch 4/10\)"):
        train_preset(data, tmp_path, callbacks=[CtrlC()])
    assert load(tmp_path / "last.ckpt")["interrupted_at"] == {"epoch": 1, "batch": 3, "step": 7}
    train_preset(data, tmp_path, resume="last")  # goes on with batch 4, the next window's first
    assert_same_state(load(preset_run[0] / "last.ckpt"), load(tmp_path / "last.ckpt"))


def test_windows_follow_the_batch_index():
    window = ManualAccumulation(3)
    assert [i for i in range(7) if window.closes(i, 7)] == [2, 5, 6]  # the epoch's last batch closes a short one
    trainer = SimpleNamespace(estimated_stepping_batches=21, max_epochs=3, max_steps=-1, num_training_batches=7)
    assert window.optimizer_steps(trainer) == 9
    assert window.optimizer_steps(SimpleNamespace(**{**vars(trainer), "max_steps": 4})) == 4


def schedule_owner(scheduler, interval: str, metrics: dict, strict: bool = True, **trainer) -> SimpleNamespace:
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    config = LRSchedulerConfig(scheduler, interval=interval, reduce_on_plateau=plateau,
                               monitor="val/loss" if plateau else None, strict=strict)
    state = SimpleNamespace(lr_scheduler_configs=[config], callback_metrics=metrics, **trainer)

    def lr_scheduler_step(scheduler, metric):
        scheduler.step() if metric is None else scheduler.step(metric)

    return SimpleNamespace(trainer=state, lr_scheduler_step=lr_scheduler_step)


def test_schedulers_step_on_their_interval():
    parameter = torch.nn.Parameter(torch.zeros(1))
    epochly = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([parameter], lr=1.0), step_size=1, gamma=0.5)
    owner = schedule_owner(epochly, "epoch", {}, global_step=3, current_epoch=0)
    step_schedulers(owner, "step")
    assert epochly.last_epoch == 0
    step_schedulers(owner, "epoch")
    assert epochly.last_epoch == 1
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD([parameter], lr=1.0), patience=0)
    step_schedulers(schedule_owner(plateau, "epoch", {"val/loss": torch.tensor(1.0)}, current_epoch=0), "epoch")
    assert plateau.best == 1.0
    step_schedulers(schedule_owner(plateau, "epoch", {}, strict=False, current_epoch=1), "epoch")  # not validated
    with pytest.raises(ValueError, match="val/loss"):
        step_schedulers(schedule_owner(plateau, "epoch", {}, current_epoch=2), "epoch")


def test_sharded_strategies_are_refused_before_training(tmp_path):
    config = KeypointTrainConfig(dataset_dir=None, output_dir=str(tmp_path))
    for strategy in ("deepspeed", "fsdp", FSDPStrategy()):
        with pytest.raises(ValueError, match="keypoint models do not train with the sharded strategy"):
            build_trainer(config, accelerator="cpu", strategy=strategy)
    require_data_parallel(DDPStrategy())
    require_data_parallel("ddp_find_unused_parameters_true")


def test_only_keypoint_training_optimises_manually(tmp_path, tiny_kwargs):
    from detrkit.variants import RFDETRKeypointPreviewConfig, RFDETRNanoConfig

    keypoints = KeypointTrainConfig(dataset_dir=None, output_dir=str(tmp_path), grad_accum_steps=3)
    detection = TrainConfig(dataset_dir=None, output_dir=str(tmp_path), grad_accum_steps=3)
    manual = build_trainer(keypoints, accelerator="cpu", logger=False)
    assert manual.gradient_clip_val is None and manual.accumulate_grad_batches == 1
    automatic = build_trainer(detection, accelerator="cpu", logger=False)
    assert automatic.gradient_clip_val == 0.1 and automatic.accumulate_grad_batches == 3
    keypoint_config = RFDETRKeypointPreviewConfig(**{**tiny_kwargs, "patch_size": 16, "num_keypoints_per_class": [4]})
    assert not RFDETRModelModule(keypoint_config, keypoints).automatic_optimization
    assert RFDETRModelModule(RFDETRNanoConfig(**tiny_kwargs), detection).automatic_optimization
