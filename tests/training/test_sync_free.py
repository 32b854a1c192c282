"""The training step makes the host wait for the device nowhere but in the Hungarian assignment.

STYLE principle 15. On the CPU nothing waits, so the calls that would make a CUDA host wait are
recorded instead: from the first callback's on_train_batch_start to the module's
on_train_batch_end, which follows every callback's (so forward, criterion, backward, clipping,
optimizer step, LR schedule, EMA), except inside the matcher's solver. The first step is left
out: it builds the optimizer's state and Lightning's logging buffers, once. Moves to another
device's tensor (`x.to(y.device)`) look alike on the CPU; test_sync_free_cuda judges those.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.overrides import TorchFunctionMode

from detrkit.config import TrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training import RFDETRDataModule, RFDETRModelModule, build_trainer
from detrkit.training.callbacks import nonfinite
from detrkit.training.callbacks.nonfinite import check_interval as nonfinite_interval
from detrkit.training.ema import ModelEMA
from detrkit.variants import RFDETRNanoConfig

# reading a device value on the host, or shaping a result by one
READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere",
         "masked_select", "unique", "unique_consecutive", "equal", "allclose", "is_nonzero", "bincount"}
INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}


def is_mask(index: object) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


def host_sync(func: Callable, args: tuple, kwargs: dict) -> str | None:
    """Why `func(*args, **kwargs)` would make the host wait for a CUDA device, or None."""
    name = getattr(func, "__name__", repr(func))
    if name in READS:
        return name
    if name in INDEXING and len(args) > 1:
        indices = args[1] if isinstance(args[1], (tuple, list)) else (args[1],)
        if any(is_mask(index) for index in indices):
            return f"{name} with a boolean mask"  # the mask's count shapes the result
    if name == "to" and "cpu" in (*args[1:], kwargs.get("device")):  # to(some_tensor.device) is judged on CUDA
        return 'to("cpu")'
    if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
        return f"{name}(..., device=...), a blocking host -> device copy"
    if name == "where" and len(args) == 1:
        return "where(condition)"
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 else args[0])
        if isinstance(repeats, torch.Tensor):
            return "repeat_interleave of tensor repeats without output_size"
    return None


def call_site() -> str:
    """The innermost caller outside this file, and the innermost one in detrkit."""
    frames = [f for f in traceback.extract_stack() if f.filename != __file__]
    inner = [frames[-1]] + [f for f in reversed(frames) if "detrkit" in f.filename][:1]
    return " <- ".join(dict.fromkeys(f"{'/'.join(Path(f.filename).parts[-2:])}:{f.lineno} {f.name}" for f in inner))


# (file, function) whose reads are of tensors kept on the host by design: torch.optim's step
# counts live on the CPU unless the optimizer is fused or capturable
HOST_BY_DESIGN = {("optimizer.py", "_get_value")}


class SyncRecorder(TorchFunctionMode):
    """While `on`, records each call that would make the host wait for the device, and where."""

    def __init__(self) -> None:
        super().__init__()
        self.on, self.found, self.steps = False, [], 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.on and (reason := host_sync(func, args, kwargs)):
            caller = traceback.extract_stack(limit=2)[0]
            if (Path(caller.filename).name, caller.name) not in HOST_BY_DESIGN:
                self.found.append(f"{reason} at {call_site()}")
        return func(*args, **kwargs)


class SwitchOn(pl.Callback):
    """As the first callback, turns a watch on at the start of each batch after the first."""

    def __init__(self, watch) -> None:
        self.watch = watch

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step >= 1:  # after the warm-up step
            self.watch.on = True
            self.watch.steps += 1


def switch_off_at_batch_end(module: pl.LightningModule, watch) -> None:
    """The module's on_train_batch_end runs after every callback's (EMA, checkpoints): turn off there."""
    hook = module.on_train_batch_end

    def hook_then_off(*args) -> None:
        hook(*args)
        watch.on = False
    module.on_train_batch_end = hook_then_off


def unwatched(solve: Callable, watch) -> Callable:
    """The matcher's solver with the watch off while it runs: the one sync the step may make."""
    def solve_unwatched(*args):
        was, watch.on = watch.on, False
        try:
            return solve(*args)
        finally:
            watch.on = was
    return solve_unwatched


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=2,
                                  image_size=(96, 64), seed=0)


def watched_fit(data: Path, output: Path, tiny_kwargs: dict, watch, steps: int = 3, change=None,
                **train_kwargs) -> RFDETRModelModule:
    """Fit a tiny detector for `steps` steps with `watch` switched on around each step after the
    first; `change(module)` may alter the module before."""
    model_config = RFDETRNanoConfig(**{**tiny_kwargs, "num_classes": 3})
    settings = dict(epochs=1, batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, seed=0, device="cpu")
    train_config = TrainConfig(dataset_dir=str(data), output_dir=str(output), **{**settings, **train_kwargs})
    module = RFDETRModelModule(model_config, train_config)
    module.criterion.matcher.solve = unwatched(module.criterion.matcher.solve, watch)
    switch_off_at_batch_end(module, watch)
    if change is not None:
        change(module)
    trainer = build_trainer(train_config, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.callbacks.insert(0, SwitchOn(watch))
    trainer.fit(module, datamodule=RFDETRDataModule(model_config, train_config))
    return module


def test_training_steps_never_wait_for_the_device(data, tmp_path, tiny_kwargs, monkeypatch):
    # the non-finite guard reads its flag every step on the CPU, where it is free, and every 10th on CUDA
    monkeypatch.setattr(nonfinite, "check_interval", lambda device_type: nonfinite_interval("cuda"))
    recorder = SyncRecorder()
    with recorder:
        watched_fit(data, tmp_path, tiny_kwargs, recorder)
    assert recorder.steps == 2
    assert recorder.found == [], "\n".join(recorder.found)


def item_after(function: Callable) -> Callable:
    """`function` followed by a host read, the kind of sync the test must catch."""
    def function_then_item(*args, **kwargs):
        result = function(*args, **kwargs)
        torch.ones(()).item()
        return result
    return function_then_item


@pytest.mark.parametrize("where", ["criterion", "ema"])  # in the step, and in the last callback's hook
def test_a_sync_in_the_step_is_caught(where, data, tmp_path, tiny_kwargs, monkeypatch):
    if where == "ema":
        monkeypatch.setattr(ModelEMA, "update", item_after(ModelEMA.update))
    def change(module):
        if where == "criterion":
            module.criterion = item_after(module.criterion)
    recorder = SyncRecorder()
    with recorder:
        watched_fit(data, tmp_path, tiny_kwargs, recorder, change=change)
    assert any(site.startswith("item at") for site in recorder.found), recorder.found
