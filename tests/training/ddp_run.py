"""Run by tests/training/test_distributed.py: train or validate a tiny model on CPU with one or more
processes (gloo), launched by Lightning itself or by torchrun. Each process writes
`rank<r>.json` (its pid, parent pid, validation metrics) and `writes<r>.txt` (every file it wrote
through detrkit) into the output folder.

    python ddp_run.py train|validate DATA OUTPUT --devices N|auto --batch-size B [--weights FILE]

Mode `nonfinite` trains with the EMA and a NaN pixel in the batches that `--poison RANK,EPOCH,BATCH`
name (a batch of one process only); each process writes into `rank<r>.json` the NonFiniteLossError
it raised (or null) and the image ids of its poisoned batches, and at the end of each epoch
`final<r>.pt`: its live and EMA weights, its AdamW step counts and its step.

Mode `interrupt` trains with the EMA and train/* logs reduced over processes; `--ctrl-c
RANK,EPOCH,BATCH` sends SIGINT to that process as that batch starts, and each process writes the
TrainingInterrupted message it raised (or null) into `rank<r>.json`; `--resume` continues from
last.ckpt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_config.TINY

from tiny_config import TINY  # noqa: E402

import detrkit.training.checkpoints as checkpoints  # noqa: E402
import detrkit.training.run_record as run_record  # noqa: E402
from detrkit import RFDETRNano  # noqa: E402
from detrkit.training.callbacks.interrupt import TrainingInterrupted  # noqa: E402
from detrkit.training.callbacks.nonfinite import NonFiniteLossError  # noqa: E402


def record_writes(output: Path) -> None:
    """Log each file detrkit writes, by this process."""
    original = checkpoints.replace_atomically

    def logged(path, write):
        rank = int(os.environ.get("LOCAL_RANK", 0))
        with open(output / f"writes{rank}.txt", "a") as stream:
            stream.write(f"{Path(path).name}\n")
        original(path, write)

    checkpoints.replace_atomically = logged
    run_record.replace_atomically = logged


class Poison(pl.Callback):
    """A NaN pixel in the (rank, epoch, batch index) batches; records their image ids."""

    def __init__(self, steps: set[tuple[int, int, int]]) -> None:
        self.steps, self.image_ids = steps, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.global_rank, trainer.current_epoch, batch_idx) in self.steps:
            batch.pixels[0, 0, 0, 0] = float("nan")
            self.image_ids[f"{trainer.current_epoch},{batch_idx}"] = [t.image_id for t in batch.targets]


class Snapshot(pl.Callback):
    """At the end of each epoch, this process's live and EMA weights and AdamW step counts to final<r>.pt."""

    def __init__(self, output: Path) -> None:
        self.output = output

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        states = trainer.optimizers[0].state.values()
        torch.save({"live": pl_module.model.state_dict(), "ema": pl_module.ema.module.state_dict(),
                    "ema_updates": pl_module.ema.updates, "global_step": trainer.global_step,
                    "adam_steps": sorted({int(state["step"]) for state in states})},
                   self.output / f"final{trainer.global_rank}.pt")


def train_nonfinite(model: RFDETRNano, args: argparse.Namespace, settings: dict) -> dict:
    poison = Poison({tuple(int(v) for v in step.split(",")) for step in args.poison})
    error = None
    try:
        model.train(epochs=args.epochs, use_ema=True, checkpoint_interval=1, callbacks=[poison, Snapshot(args.output)],
                    skip_nonfinite_steps=args.skip_nonfinite, **settings)
    except NonFiniteLossError as raised:
        error = str(raised)
    return {"error": error, "poisoned": poison.image_ids}


class CtrlC(pl.Callback):
    """SIGINT to this process as the (rank, epoch, batch index) batch starts."""

    def __init__(self, at: tuple[int, int, int] | None) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.global_rank, trainer.current_epoch, batch_idx) == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def train_interrupted(model: RFDETRNano, args: argparse.Namespace, settings: dict) -> dict:
    at = tuple(int(v) for v in args.ctrl_c.split(",")) if args.ctrl_c else None
    try:
        model.train(epochs=args.epochs, use_ema=True, checkpoint_interval=1, train_log_sync_dist=True,
                    callbacks=[CtrlC(at)], resume="last" if args.resume else None, **settings)
    except TrainingInterrupted as raised:
        return {"error": str(raised)}
    return {"error": None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "validate", "nonfinite", "interrupt"])
    parser.add_argument("data")
    parser.add_argument("output", type=Path)
    parser.add_argument("--devices", type=lambda v: v if v == "auto" else int(v), default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--weights")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--poison", action="append", default=[])
    parser.add_argument("--skip-nonfinite", type=int, default=0)
    parser.add_argument("--ctrl-c")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    args.output.mkdir(parents=True, exist_ok=True)
    record_writes(args.output)
    torch.manual_seed(0)
    distributed = dict(devices=args.devices, accelerator="cpu", strategy="auto" if args.devices == 1 else "ddp")
    settings = dict(dataset_dir=args.data, output_dir=str(args.output), batch_size=args.batch_size,
                    eval_batch_size=1, num_workers=0, progress_bar=None, tensorboard=False, seed=0)
    model = RFDETRNano(**{**TINY, **({"pretrain_weights": args.weights} if args.weights else {})})
    metrics, report = {}, {}
    if args.mode == "train":
        model.train(epochs=args.epochs, use_ema=False, run_test=True, checkpoint_interval=1, **settings,
                    **distributed)
    elif args.mode == "nonfinite":
        report = train_nonfinite(model, args, {**settings, **distributed})
    elif args.mode == "interrupt":
        report = train_interrupted(model, args, {**settings, **distributed})
    else:
        from detrkit.training import RFDETRDataModule, RFDETRModelModule, build_trainer
        from detrkit.training.trainer import split_train_kwargs

        config, trainer_kwargs = split_train_kwargs({**settings, **distributed})
        datamodule = RFDETRDataModule(model.model_config, config)
        module = RFDETRModelModule(model.model_config, config, detector=model.model,
                                   class_names=datamodule.class_names)
        trainer = build_trainer(config, **trainer_kwargs)
        metrics = {k: float(v) for k, v in trainer.validate(module, datamodule=datamodule, verbose=False)[0].items()}
    rank = int(os.environ.get("LOCAL_RANK", 0))
    (args.output / f"rank{rank}.json").write_text(json.dumps(
        {"pid": os.getpid(), "ppid": os.getppid(), "metrics": metrics, **report}))


if __name__ == "__main__":
    main()
