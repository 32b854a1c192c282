"""Checkpoint files of a run (spec section 14): atomic writes, the lightweight `.pth` files and the
callback that keeps the best weights.

Full checkpoints (`last.ckpt`, `checkpoint_<epoch>.ckpt`) are Lightning's own, written through
`AtomicCheckpointIO`. Lightweight files hold the detector weights, its config and class names,
the epoch and the callbacks' states, without optimizer or scheduler state.
"""

from __future__ import annotations

import copy
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_info

from detrkit.training.ema import portable_weights
from detrkit.version import __version__

BEST_REGULAR, BEST_EMA, BEST_TOTAL, LAST_EMA = (
    "checkpoint_best_regular.pth", "checkpoint_best_ema.pth", "checkpoint_best_total.pth", "last_ema.pth")
# the callbacks whose state a lightweight file carries, by Lightning state key
_LIGHT_CALLBACKS = ("EMA", "BestModels", "EarlyStopping")


def create_temporary(folder: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file in `folder` opened for writing, as (descriptor, path). Unlike tempfile.mkstemp
    (always 0600) it gets the permissions of any file the user creates: 0666 less the umask."""
    for _ in range(100):
        name = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {folder}")


def replace_atomically(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write` into a temporary file beside `path`, then rename it over `path`:
    a reader, a crash or a kill never sees half a file, and the old file survives a failure."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = create_temporary(path.parent, f".{path.name}.", ".tmp")
    except OSError as error:
        raise _write_error(path, error) from error
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        os.unlink(temporary)
        if isinstance(error, OSError) and not isinstance(error, CheckpointWriteError):
            raise _write_error(path, error) from error
        raise


class CheckpointWriteError(OSError):
    """A run's file could not be written (disk full, read-only, ...); the previous file is intact."""


def _write_error(path: Path, error: OSError) -> CheckpointWriteError:
    reason = os.strerror(error.errno) if error.errno else str(error)
    kept = "the previous file is intact" if path.exists() else "no earlier file existed"
    error_number = error.errno or 0
    return CheckpointWriteError(error_number, f"could not write {path} ({reason}); {kept} and no partial file was "
                                              f"left behind. Free space or fix the permissions of {path.parent}, "
                                              f"then resume with resume='last'")


def save_atomically(payload: Any, path: str | Path) -> None:
    replace_atomically(path, lambda stream: torch.save(payload, stream))


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, writing each file atomically."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        save_atomically(checkpoint, path)


class FileCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, told apart from other instances by its file name (two of them
    with the same interval would otherwise share a state key)."""

    @property
    def state_key(self) -> str:
        return self._generate_state_key(filename=self.filename, every_n_epochs=self._every_n_epochs)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and trainer.is_global_zero and self.dirpath and self.filename == "last":
            remove_stale_temporaries(Path(self.dirpath))


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary checkpoint files (of `replace_atomically`) that a killed write left in
    `directory`; returns them. The files they were to replace are untouched."""
    stale = [*directory.glob(".*.ckpt.*.tmp"), *directory.glob(".*.pth.*.tmp")]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        rank_zero_info(f"removed {len(stale)} partial checkpoint file(s) left by an interrupted write: "
                       f"{', '.join(p.name for p in stale)}")
    return stale


def run_metadata(pl_module: pl.LightningModule) -> dict[str, Any]:
    """What every checkpoint of a run says about the model beside its weights."""
    train_config = pl_module.train_config.model_dump(mode="json")
    return {
        "model_name": pl_module.model_name,
        "model_config": pl_module.model_config.model_dump(mode="json"),
        "args": {**train_config, "class_names": pl_module.class_names},
        "class_names": pl_module.class_names,
        "detrkit_version": __version__,
    }


def lightweight_checkpoint(trainer: pl.Trainer, pl_module: pl.LightningModule,
                           weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A `.pth` payload: `weights` (plain detector keys), metadata, epoch and callback states.

    Tensors that also appear in a callback state (the EMA file's weights) are the same objects,
    which torch.save stores once."""
    callbacks = {}
    for callback in trainer.callbacks:
        if callback.state_key in _LIGHT_CALLBACKS:
            callbacks[callback.state_key] = callback.state_dict()
    return {
        "model": weights,
        **run_metadata(pl_module),
        "epoch": trainer.fit_loop.epoch_progress.current.ready - 1,  # the epoch last trained
        "global_step": trainer.global_step,
        "loops": {"fit_loop": _epoch_end_loop_state(trainer)},
        "callbacks": callbacks,
        "output_dir": pl_module.train_config.output_dir,
    }


def _epoch_end_loop_state(trainer: pl.Trainer) -> dict[str, Any]:
    """The fit loop's counters as they are once this epoch is over, so that a run resumed from the
    file starts with the next epoch (files are written during validation, before that point)."""
    state = copy.deepcopy(trainer.fit_loop.state_dict())
    for counters in state["epoch_progress"].values():
        counters["processed"] = max(counters["processed"], counters["ready"])
    return state


def metric_key(best_model_metric: str, segmentation: bool = False, keypoints: bool = False) -> str:
    """Name (without stage prefix) of the validation metric that ranks weights (spec 14):
    segmentation runs rank by mask mAP, and by the box mAR for "mar"; keypoint runs by OKS
    keypoint AP, and by keypoint AR for "mar"."""
    if keypoints:
        return {"map": "keypoint_map_50_95", "mar": "keypoint_mAR"}[best_model_metric]
    if segmentation and best_model_metric == "map":
        return "segm_mAP_50_95"
    return {"map": "mAP_50_95", "mar": "mAR"}[best_model_metric]


class BestModels(pl.Callback):
    """Writes `checkpoint_best_regular.pth` / `checkpoint_best_ema.pth` when the (optionally
    smoothed) validation metric of the live / EMA weights strictly improves, and at the end
    `last_ema.pth` and `checkpoint_best_total.pth` (the better of the two, with its source).

    Epochs before `skip_epochs` are not ranked. Only the main process writes.
    """

    def __init__(self, output_dir: str | Path, metric: str = "map", skip_epochs: int = 0,
                 smooth_alpha: float = 0.0, segmentation: bool = False, keypoints: bool = False) -> None:
        self.output_dir = Path(output_dir)
        self.key = metric_key(metric, segmentation, keypoints)
        self.skip_epochs, self.smooth_alpha = skip_epochs, smooth_alpha
        self.best: dict[str, float] = {}  # track ("regular" / "ema") -> best smoothed score
        self.smoothed: dict[str, float] = {}

    @property
    def state_key(self) -> str:
        return "BestModels"

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best), "smoothed": dict(self.smoothed), "output_dir": str(self.output_dir)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = dict(state_dict.get("best", {}))
        self.smoothed = dict(state_dict.get("smoothed", {}))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or trainer.current_epoch < self.skip_epochs:
            return
        metrics = trainer.callback_metrics
        tracks = {"regular": f"val/{self.key}"} if pl_module.evaluates_base_model else {}
        if getattr(pl_module, "ema", None) is not None:
            tracks["ema"] = f"val/ema_{self.key}"
        for track, name in tracks.items():
            if name not in metrics:
                continue
            value = float(metrics[name])
            previous = self.smoothed.get(track)
            value = value if previous is None else self.smooth_alpha * previous + (1 - self.smooth_alpha) * value
            self.smoothed[track] = value
            if track not in self.best or value > self.best[track]:
                self.best[track] = value
                self._save(trainer, pl_module, track)

    def _save(self, trainer: pl.Trainer, pl_module: pl.LightningModule, track: str) -> None:
        if not trainer.is_global_zero:
            return
        if track == "ema":
            payload = lightweight_checkpoint(trainer, pl_module, portable_weights(pl_module.ema.module))
        else:
            payload = lightweight_checkpoint(trainer, pl_module, portable_weights(pl_module.model))
        save_atomically(payload, self.output_dir / (BEST_EMA if track == "ema" else BEST_REGULAR))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """last_ema.pth, a back-filled best EMA file, and the best of all. Runs before the EMA
        callback hands its weights to the live model (callbacks run in order; see build_trainer)."""
        ema = getattr(pl_module, "ema", None)
        if trainer.is_global_zero and ema is not None:
            payload = lightweight_checkpoint(trainer, pl_module, portable_weights(ema.module))
            save_atomically(payload, self.output_dir / LAST_EMA)
            if not (self.output_dir / BEST_EMA).exists():
                save_atomically(payload, self.output_dir / BEST_EMA)
        if trainer.is_global_zero:
            self._write_best_total()

    def best_total_source(self) -> str | None:
        """"ema" or "regular": the EMA wins unless the live weights were scored and scored higher."""
        if "ema" in self.best and ("regular" not in self.best or self.best["ema"] > self.best["regular"]):
            return "ema"
        if "regular" in self.best:
            return "regular"
        return "ema" if (self.output_dir / BEST_EMA).exists() else None

    def _write_best_total(self) -> None:
        source = self.best_total_source()
        if source is None:
            return
        payload = torch.load(self.output_dir / (BEST_EMA if source == "ema" else BEST_REGULAR),
                             map_location="cpu", weights_only=True)
        payload["best_total_source"] = source
        save_atomically(payload, self.output_dir / BEST_TOTAL)
        score = self.best.get(source)
        rank_zero_info(f"best weights ({source}{f', val/{self.key} {score:.4f}' if score is not None else ''}) "
                       f"in {self.output_dir / BEST_TOTAL}")
