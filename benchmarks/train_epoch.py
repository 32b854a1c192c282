#!/usr/bin/env python3
"""Wall time of train() epochs (training + validation + files) on a generated data set, optionally
beside the reference package on the same data in the same run.

    python benchmarks/train_epoch.py [--epochs 1] [--train-images 48] [--valid-images 16] \
        [--ema | --no-ema] [--seed 0 --repeats 1 | --seeds 0 1 2] \
        [--reference-python REF/bin/python] [--device cpu] [--dataset DIR] \
        [--train-kwargs '{"multi_scale": false}'] [--no-count-flops] [--out result.json]

Each seed trains detrkit, then the reference, on the same data (the data set is generated once,
with seed 0). The seed seeds the global torch RNG before the model is built (both packages
initialise weights at construction) and is the run's TrainConfig.seed. EMA is on by default on
both sides, as in both packages. The JSON gives per-seed and mean validation mAP@50 after each
epoch (and per-seed mAP@75 and mAP@50:95) and per-seed and mean wall times; with `--out` it is
rewritten after every run.

The ratio is mean reference seconds / mean detrkit seconds. The floor estimate counts the FLOPs of one
training step (forward + backward at the nominal resolution) with torch's counter and divides
by a measured fp32 GEMM rate.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-images", type=int, default=48)
    parser.add_argument("--valid-images", type=int, default=16)
    parser.add_argument("--resolution", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True,
                        help="train with an EMA of the weights on both sides (default: on, both packages' default)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (with --repeats)")
    parser.add_argument("--repeats", type=int, default=1, help="runs with seeds seed, seed+1, ...")
    parser.add_argument("--seeds", type=int, nargs="+", help="explicit seeds (overrides --seed/--repeats)")
    parser.add_argument("--reference-python")
    parser.add_argument("--device", default="cpu", help="torch device of both packages' runs (default: cpu)")
    parser.add_argument("--train-kwargs", default="{}",
                        help='JSON object of further train() keywords for both packages, e.g. {"multi_scale": false}')
    parser.add_argument("--dataset", type=Path,
                        help="train on this folder instead of generating one (so parallel runs share it)")
    parser.add_argument("--count-flops", action=argparse.BooleanOptionalAction, default=True,
                        help="count the FLOPs of one training step and time a GEMM for the floor (default: on)")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def detrkit_run(args: argparse.Namespace, dataset: Path, output: Path, seed: int, count_flops: bool) -> dict:
    from detrkit import RFDETRNano

    torch.manual_seed(seed)  # weights are initialised here, before train() seeds the run
    model = RFDETRNano(pretrain_weights=None, device=args.device, resolution=args.resolution)
    start = time.perf_counter()
    settings = dict(dataset_dir=str(dataset), output_dir=str(output), epochs=args.epochs, batch_size=args.batch_size,
                    num_workers=args.workers, use_ema=args.ema, seed=seed, tensorboard=False, progress_bar=None)
    model.train(**{**settings, **json.loads(args.train_kwargs)})
    seconds = time.perf_counter() - start
    with open(output / "metrics.csv", newline="") as stream:
        rows = [r for r in csv.DictReader(stream) if r.get("val/mAP_50")]
    result = {"seed": seed, "seconds": seconds, **{key: [float(r[f"val/mAP_{key[4:]}"]) for r in rows]
                                                   for key in ("map_50", "map_75", "map_50_95")}}
    if count_flops:
        result["step_gflop"] = step_gflops(model, args)
    return result


def step_gflops(model, args: argparse.Namespace) -> float:
    """FLOPs of one training forward + backward at the nominal resolution (all query groups)."""
    from torch.utils.flop_counter import FlopCounterMode

    detector = model.model.train()
    pixels = torch.randn(args.batch_size, 3, args.resolution, args.resolution, device=args.device)
    with FlopCounterMode(display=False) as counter:
        out = detector(pixels)
        (out.pred_logits.sum() + out.pred_boxes.sum()).backward()
    detector.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 1e9


def reference_run(args: argparse.Namespace, dataset: Path, output: Path, seed: int) -> dict:
    command = [args.reference_python, str(HERE / "reference_train_epoch.py"), "--dataset", str(dataset),
               "--output", str(output), "--resolution", str(args.resolution), "--batch-size",
               str(args.batch_size), "--epochs", str(args.epochs), "--threads", str(args.threads),
               "--workers", str(args.workers), "--seed", str(seed), "--ema" if args.ema else "--no-ema",
               "--device", args.device, "--train-kwargs", args.train_kwargs]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.stderr.write(result.stderr[-4000:])
        raise RuntimeError(f"the reference run failed with exit status {result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def gemm_rate() -> float:
    a, b = torch.randn(1160, 384), torch.randn(384, 1536)
    for _ in range(3):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(20))
    return 2 * 1160 * 384 * 1536 / best / 1e9


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def summarise(runs: list[dict]) -> dict:
    """Per-seed mAP@50 lists and seconds, their means (mAP per epoch)."""
    maps = [run["map_50"] for run in runs]
    epochs = min(len(m) for m in maps)
    return {"seeds": [run["seed"] for run in runs], "per_seed_map_50": maps,
            "per_seed_map_75": [run.get("map_75") for run in runs],
            "per_seed_map_50_95": [run.get("map_50_95") for run in runs],
            "mean_map_50": [sum(m[e] for m in maps) / len(maps) for e in range(epochs)],
            "per_seed_seconds": [run["seconds"] for run in runs],
            "mean_seconds": sum(run["seconds"] for run in runs) / len(runs)}


def report(args: argparse.Namespace, ours: list[dict], theirs: list[dict], rate: float | None) -> dict:
    steps = args.epochs * -(-args.train_images // args.batch_size)
    mine = summarise(ours)
    result = {"epochs": args.epochs, "train_images": args.train_images, "valid_images": args.valid_images,
              "resolution": args.resolution, "batch_size": args.batch_size, "threads": args.threads,
              "workers": args.workers, "ema": args.ema, "train_kwargs": json.loads(args.train_kwargs),
              "seeds": mine["seeds"], "steps": steps,
              "detrkit": mine, "detrkit_seconds": mine["mean_seconds"], "detrkit_map_50": mine["mean_map_50"]}
    gflop = ours[0].get("step_gflop")
    if gflop is not None:
        result["step_gflop"] = gflop
        if rate:
            result.update(gemm_gflop_per_s=rate, step_floor_s=gflop / rate)
    if theirs:
        ref = summarise(theirs)
        paired = ours[:len(theirs)]
        result.update(reference=ref, reference_seconds=ref["mean_seconds"], reference_map_50=ref["mean_map_50"],
                      speedup=ref["mean_seconds"] / (sum(r["seconds"] for r in paired) / len(paired)))
    return result


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from detrkit.datasets.synthetic import make_synthetic_dataset

    seeds = args.seeds if args.seeds else [args.seed + k for k in range(args.repeats)]
    ours: list[dict] = []
    theirs: list[dict] = []

    def emit(rate: float | None = None) -> str:
        text = json.dumps(report(args, ours, theirs, rate), indent=2)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return text

    with tempfile.TemporaryDirectory() as scratch:
        dataset = args.dataset or make_synthetic_dataset(Path(scratch) / "data", num_train=args.train_images,
                                                         num_valid=args.valid_images, seed=0)
        for seed in seeds:
            ours.append(detrkit_run(args, dataset, Path(scratch) / f"detrkit-{seed}", seed,
                                    count_flops=args.count_flops and not ours))
            print(f"detrkit seed {seed}: {ours[-1]['seconds']:.1f} s, mAP@50 {ours[-1]['map_50']}",
                  file=sys.stderr, flush=True)
            emit()
            if args.reference_python:
                theirs.append(reference_run(args, dataset, Path(scratch) / f"reference-{seed}", seed))
                print(f"reference seed {seed}: {theirs[-1]['seconds']:.1f} s, mAP@50 {theirs[-1]['map_50']}",
                      file=sys.stderr, flush=True)
                emit()
    print(emit(gemm_rate() if args.device == "cpu" and args.count_flops else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
