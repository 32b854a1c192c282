"""`resume=`: continue a run from a full Lightning checkpoint, or warm-start from a lightweight `.pth`.

A full checkpoint (`last.ckpt`, `checkpoint_<epoch>.ckpt`) restores everything through Lightning:
weights, optimizer, LR scheduler, epoch and step, callback states (EMA, early stopping, best
scores), random generator states and the data order. A lightweight file restores the weights,
the epoch and the EMA / early-stopping states; best scores only when the run writes to the
directory the file was written in. Both are checked against the model before training starts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from detrkit.models.weights import (
    _POSITION_KEY,
    _QUERY_KEYS,
    SAFE_CLASSES,
    Checkpoint,
    CheckpointError,
    read_checkpoint,
)


@dataclass
class ResumePoint:
    path: Path
    full: bool  # a Lightning checkpoint with optimizer and scheduler state
    raw: dict[str, Any]

    @property
    def epoch(self) -> int:
        """The last epoch (0-based) the checkpoint finished (one before its own when it was
        written inside an epoch, on Ctrl-C)."""
        return int(self.raw.get("epoch", -1)) - ("interrupted_at" in self.raw)

    @property
    def ckpt_path(self) -> str | None:
        """What Trainer.fit(ckpt_path=...) takes: full checkpoints only."""
        return str(self.path) if self.full else None


def locate(resume: str, output_dir: str) -> Path:
    """`resume` as a file path; "last" means output_dir/last.ckpt."""
    path = Path(output_dir) / "last.ckpt" if resume == "last" else Path(resume).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"resume={resume!r}: no checkpoint file at {path}")
    return path


def open_resume_point(resume: str, output_dir: str, model: torch.nn.Module) -> ResumePoint:
    """Read and check a resume checkpoint against `model` (architecture and class count), so that a
    mismatch fails before any training work starts."""
    path = locate(resume, output_dir)
    checkpoint = read_checkpoint(path)  # a clear CheckpointError for corrupt or foreign files
    expected = model.state_dict()
    missing = [key for key in expected if key not in checkpoint.weights]
    if missing:
        raise CheckpointError(f"{path} is a checkpoint of another architecture: it lacks {len(missing)} of the "
                              f"model's tensors, e.g. {missing[0]}")
    if checkpoint.num_logits != expected["class_embed.bias"].shape[0]:
        raise CheckpointError(
            f"{path} was trained with {checkpoint.num_logits - 1} classes but this run has "
            f"{expected['class_embed.bias'].shape[0] - 1}; resume needs the same classes "
            f"(use pretrain_weights= to fine-tune on other classes)")
    for key, tensor in expected.items():
        if checkpoint.weights[key].shape != tensor.shape:
            raise CheckpointError(_shape_mismatch(checkpoint, key, tuple(tensor.shape)))
    with torch.serialization.safe_globals(SAFE_CLASSES):  # published files keep their arguments as a Namespace
        raw = torch.load(path, map_location="cpu", weights_only=True)
    full = bool(raw.get("optimizer_states")) and "loops" in raw
    return ResumePoint(path, full, raw)


def warm_start(point: ResumePoint, trainer: pl.Trainer, pl_module: pl.LightningModule, output_dir: str) -> None:
    """Apply a lightweight file before fit: weights, epoch counters and callback states."""
    weights = {key[len("model."):] if key.startswith("model.") else key: value
               for key, value in (point.raw.get("model") or point.raw["state_dict"]).items()}
    pl_module.model.load_state_dict(weights)
    states = point.raw.get("callbacks") or {}
    same_dir = Path(str(point.raw.get("output_dir", ""))).resolve() == Path(output_dir).resolve()
    restored = []
    for callback in trainer.callbacks:
        key = callback.state_key
        if key not in states or not states[key] or (key == "BestModels" and not same_dir):
            continue
        callback.load_state_dict(states[key])
        restored.append(key)
    loops = point.raw.get("loops") or {}
    if "fit_loop" in loops:
        trainer.fit_loop.load_state_dict(loops["fit_loop"])
    warnings.warn(
        f"resume={point.path} is a lightweight checkpoint: weights{''.join(', ' + k for k in restored)} state "
        f"restored, but the optimizer and LR scheduler start cold"
        f"{'' if same_dir else ' and best-score tracking restarts (output_dir differs from where it was written)'}. "
        f"Resume from a full checkpoint (last.ckpt) to continue them.", UserWarning, stacklevel=3)


def _shape_mismatch(checkpoint: Checkpoint, key: str, wanted: tuple[int, ...]) -> str:
    """Why the checkpoint's `key` does not fit, in the config fields a user changes."""
    saved, path = tuple(checkpoint.weights[key].shape), checkpoint.path
    settings = {**checkpoint.args, **checkpoint.model_config}
    if key in _QUERY_KEYS:
        layout = (f" (num_queries={settings['num_queries']} x group_detr={settings['group_detr']})"
                  if "num_queries" in settings and "group_detr" in settings else "")
        return (f"{path} was trained with {saved[0]} query rows{layout}, this model has {wanted[0]}: resume needs "
                f"the same num_queries and group_detr. To train with other ones, start from the file with "
                f"pretrain_weights= (query rows are copied group by group)")
    if key == _POSITION_KEY:
        side = round((saved[1] - 1) ** 0.5)
        return (f"{path} was trained with positional_encoding_size={side}, this model has "
                f"{round((wanted[1] - 1) ** 0.5)}: resume needs the same (another resolution alone is fine). To "
                f"change it, start from the file with pretrain_weights= (position embeddings are resized)")
    return f"{path} is a checkpoint of another architecture: {key} has shape {saved}, the model {wanted}"
