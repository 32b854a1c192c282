#!/usr/bin/env python3
"""Keypoint, mask or box learning side by side (issues 21, 20 and 26): a small RFDETRKeypointPreview,
RFDETRSegNano or RFDETRNano from scratch with detrkit and with the reference, the same model, data, epochs and
seeds; keypoint AP (OKS), mask AP or box AP by epoch, paired. The JSON is rewritten after every seed.

    python benchmarks/task_learning.py --reference-python REF/bin/python [--task pose|segment|detect] \
        [--seeds 0 1 2] [--epochs 10] [--train 64] [--valid 16] [--threads 2] [--out result.json]

Data. pose: detrkit's synthetic shapes with the four corners of each shape's box as visible COCO
keypoints (`make_synthetic_dataset(keypoints=True)`, 3 classes x 4 keypoints), the demo's set;
detect: the same shapes without keypoints, so that a gap seen with keypoints can be told apart from
one of the detector's training alone.
segment: real photographs with polygon masks, the coins scenes of benchmarks/seg_epoch.py (3-12 coins
cut from scikit-image's photograph on real backgrounds, 320-480 px wide; the wheels it reads are
fetched with pip once). `--data` swaps the images: the coins for detect (their boxes), the shapes
(whose polygon masks are exact, and quicker to learn) for segment.
Model: the demo's small sizes (192 px, 2 decoder layers, 30 queries, 4 groups) on the task's
published layout (keypoint preview and Nano: patch 16, 2 windows; SegNano: patch 12, 1 window, its
mask head). Each package trains in its own process (`--side`, under its own interpreter; detrkit's
from this checkout's src/), after seeding torch's global RNG with the seed, with the same train()
keywords; the curves are read from each run's metrics.csv (validation of the EMA weights where the
package logs both). `--detrkit-arm` trains detrkit's side through a benchmarks/learning_arms.py arm
(one part swapped for the reference's), in the reference's interpreter. The JSON holds both curves
per seed and, per epoch, the mean paired difference (detrkit - reference) +- its SE.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = dict(pretrain_weights=None, resolution=192, dec_layers=2, num_queries=30, num_select=30, group_detr=4)
TASKS = {
    "pose": {"model": "RFDETRKeypointPreview",
             "kwargs": dict(SMALL, positional_encoding_size=12, patch_size=16, num_windows=2,
                            num_keypoints_per_class=[4, 4, 4]),
             "metrics": ("keypoint_map_50", "keypoint_map_50_95", "mAP_50")},
    "detect": {"model": "RFDETRNano",
               "kwargs": dict(SMALL, positional_encoding_size=12, patch_size=16, num_windows=2),
               "metrics": ("mAP_50", "mAP_50_95", "mAP_75")},
    "segment": {"model": "RFDETRSegNano", "kwargs": dict(SMALL, positional_encoding_size=16),
                "metrics": ("segm_mAP_50", "segm_mAP_50_95", "mAP_50")},
}
TRAINING = dict(batch_size=4, lr=4e-4, lr_encoder=4e-4, multi_scale=False, num_workers=0, tensorboard=False,
                warmup_epochs=0.0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=["detrkit", "rfdetr"], help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--reference-python")
    parser.add_argument("--task", choices=sorted(TASKS), default="pose")
    parser.add_argument("--data", choices=["shapes", "coins"],
                        help="training images: detrkit's synthetic shapes with exact polygon masks (default "
                             "for pose and detect) or the coins photographs (default for segment)")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--valid", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--detrkit-kwargs", type=json.loads, default={},
                        help="JSON train() keywords added on detrkit's side only (an arm of an ablation)")
    parser.add_argument("--detrkit-arm", help="train detrkit's side through this benchmarks/learning_arms.py arm "
                                              "(in the reference's interpreter, which the arms import)")
    parser.add_argument("--reference-kwargs", type=json.loads, default={},
                        help="JSON train() keywords added on the reference's side only")
    parser.add_argument("--parallel", action="store_true", help="train both sides of a seed at the same time")
    parser.add_argument("--sides", nargs="+", choices=["detrkit", "rfdetr"], default=["detrkit", "rfdetr"],
                        help="train only these sides (the paired summary needs both)")
    parser.add_argument("--kwargs", type=json.loads, default={}, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def train_side(args: argparse.Namespace) -> None:
    """One package's run (in that package's interpreter)."""
    import importlib
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    package = importlib.import_module(args.side)
    if args.arm:
        sys.path.insert(0, str(HERE))
        from learning_arms import ARMS

        ARMS[args.arm]()
    torch.manual_seed(args.seed)  # both packages initialise the weights at construction
    task = TASKS[args.task]
    model = getattr(package, task["model"])(**task["kwargs"], device="cpu")
    model.train(dataset_dir=str(args.dataset), output_dir=str(args.output), epochs=args.epochs, seed=args.seed,
                **{**TRAINING, **args.kwargs})


def curves(metrics_csv: Path, metrics: tuple[str, ...]) -> dict[str, list[float]]:
    """Per epoch, the last non-empty value of each validation metric (EMA's where logged), for
    CSV files with one row per epoch or several rows per epoch."""
    by_epoch: dict[int, dict[str, float]] = {}
    with metrics_csv.open() as stream:
        for row in csv.DictReader(stream):
            if not row.get("epoch"):
                continue
            values = by_epoch.setdefault(int(float(row["epoch"])), {})
            values.update({key: float(value) for key, value in row.items() if key.startswith("val/") and value})
    result: dict[str, list[float]] = {}
    for name in metrics:
        for key in (f"val/ema_{name}", f"val/{name}"):
            if all(key in values for values in by_epoch.values()):
                result[name] = [by_epoch[epoch][key] for epoch in sorted(by_epoch)]
                break
    return result


def start_side(python: str, side: str, dataset: Path, output: Path, args: argparse.Namespace, seed: int):
    env = dict(os.environ)
    if side == "detrkit":
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    extra = args.detrkit_kwargs if side == "detrkit" else args.reference_kwargs
    arm = ["--arm", args.detrkit_arm] if side == "detrkit" and args.detrkit_arm else []
    command = [args.reference_python if arm else python, str(Path(__file__).resolve()), "--side", side,
               "--dataset", str(dataset), "--output", str(output), "--epochs", str(args.epochs),
               "--threads", str(args.threads), "--seed", str(seed), "--task", args.task,
               "--kwargs", json.dumps(extra), *arm]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_seed(args: argparse.Namespace, dataset: Path, scratch: Path, seed: int) -> dict:
    """Both sides of one seed, one after the other or (--parallel) at once."""
    sides = {side: python for side, python in (("detrkit", sys.executable), ("rfdetr", args.reference_python))
             if side in args.sides}
    run: dict = {"seed": seed}

    def start(side: str):
        return time.perf_counter(), start_side(sides[side], side, dataset, scratch / f"{side}-{seed}", args, seed)

    started = {side: start(side) for side in sides} if args.parallel else {}
    for side in sides:
        finish_side(run, side, *(started.get(side) or start(side)), scratch / f"{side}-{seed}", args)
    return run


def finish_side(run: dict, side: str, start: float, process, output: Path, args: argparse.Namespace) -> None:
    if process.wait():
        raise RuntimeError(f"{side} exited with status {process.returncode} ({output})")
    run[side] = {"seconds": time.perf_counter() - start, **curves(output / "metrics.csv", TASKS[args.task]["metrics"])}
    shutil.rmtree(output)  # its checkpoints take hundreds of MB a run; a failed run's folder is kept above


def mean_and_se(diffs: list[float]) -> tuple[float, float | None]:
    """The mean of paired differences and its standard error (None for a single pair)."""
    return statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None


def paired(runs: list[dict], name: str) -> list[dict]:
    """Per epoch: mean detrkit - reference difference and its standard error over the seeds."""
    rows = []
    for epoch in range(len(runs[0]["detrkit"][name])):
        mean, se = mean_and_se([run["detrkit"][name][epoch] - run["rfdetr"][name][epoch] for run in runs])
        rows.append({"epoch": epoch + 1, "mean_diff": mean, "se": se,
                     "detrkit_mean": statistics.mean(run["detrkit"][name][epoch] for run in runs),
                     "reference_mean": statistics.mean(run["rfdetr"][name][epoch] for run in runs)})
    return rows


def summary(args: argparse.Namespace, runs: list[dict]) -> dict:
    task = TASKS[args.task]
    return {"task": args.task, "data": data_of(args),
            "epochs": args.epochs, "train_images": args.train, "valid_images": args.valid,
            "model": {"class": task["model"], **task["kwargs"]}, "training": TRAINING,
            "detrkit_kwargs": args.detrkit_kwargs, "detrkit_arm": args.detrkit_arm,
            "reference_kwargs": args.reference_kwargs,
            "runs": runs,
            "paired": {name: paired(runs, name) for name in task["metrics"]
                       if all(name in run.get("detrkit", {}) and name in run.get("rfdetr", {}) for run in runs)}}


def data_of(args: argparse.Namespace) -> str:
    """The data set a run trains on: the task's default, or --data where the task can use it."""
    data = args.data or ("coins" if args.task == "segment" else "shapes")
    if (args.task, data) == ("pose", "coins"):
        raise SystemExit(f"--task {args.task} cannot train on --data {data} (it lacks the task's labels)")
    return data


def main() -> int:
    args = parse_args()
    if args.side:
        train_side(args)
        return 0
    if args.detrkit_arm:
        sys.path.insert(0, str(HERE))
        from learning_arms import ARMS

        if args.detrkit_arm not in ARMS:
            raise SystemExit(f"unknown --detrkit-arm {args.detrkit_arm!r}: one of {', '.join(ARMS)}")
        if not args.reference_python:
            raise SystemExit("--detrkit-arm runs detrkit in the reference's interpreter: pass --reference-python")
    scratch = Path(tempfile.mkdtemp(prefix=f"{args.task}-learning-"))
    if data_of(args) == "coins":
        sys.path.insert(0, str(HERE))
        from learning_matrix import WHEELS_DIR
        from seg_epoch import make_dataset

        dataset = make_dataset(scratch / "data", args.train, args.valid, 0, WHEELS_DIR)
    else:
        sys.path.insert(0, str(HERE.parent / "src"))
        from detrkit.datasets.synthetic import make_synthetic_dataset

        dataset = make_synthetic_dataset(scratch / "data", num_train=args.train, num_valid=args.valid, seed=0,
                                         keypoints=args.task == "pose")
    runs, text = [], ""
    for seed in args.seeds:
        runs.append(run_seed(args, dataset, scratch, seed))
        print(json.dumps(runs[-1]), flush=True)
        text = json.dumps(summary(args, runs), indent=2)
        if args.out:
            args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
