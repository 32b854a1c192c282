"""Run by tests/training/test_distributed.py: train or validate a tiny model on CPU with one or more
processes (gloo), launched by Lightning itself or by torchrun. Each process writes
`rank<r>.json` (its pid, parent pid, validation metrics) and `writes<r>.txt` (every file it wrote
through detrkit) into the output folder.

    python ddp_run.py train|validate DATA OUTPUT --devices N|auto --batch-size B [--weights FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_config.TINY

from tiny_config import TINY  # noqa: E402

import detrkit.training.checkpoints as checkpoints  # noqa: E402
import detrkit.training.run_record as run_record  # noqa: E402
from detrkit import RFDETRNano  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "validate"])
    parser.add_argument("data")
    parser.add_argument("output", type=Path)
    parser.add_argument("--devices", type=lambda v: v if v == "auto" else int(v), default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--weights")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    args.output.mkdir(parents=True, exist_ok=True)
    record_writes(args.output)
    torch.manual_seed(0)
    distributed = dict(devices=args.devices, accelerator="cpu", strategy="auto" if args.devices == 1 else "ddp")
    settings = dict(dataset_dir=args.data, output_dir=str(args.output), batch_size=args.batch_size,
                    eval_batch_size=1, num_workers=0, progress_bar=None, tensorboard=False, seed=0)
    model = RFDETRNano(**{**TINY, **({"pretrain_weights": args.weights} if args.weights else {})})
    metrics = {}
    if args.mode == "train":
        model.train(epochs=2, use_ema=False, run_test=True, checkpoint_interval=1, **settings, **distributed)
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
        {"pid": os.getpid(), "ppid": os.getppid(), "metrics": metrics}))


if __name__ == "__main__":
    main()
