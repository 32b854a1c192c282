#!/usr/bin/env python3
"""Wall time of train() epochs (training + validation + files) on a generated data set, optionally
beside the reference package on the same data in the same run.

    python benchmarks/train_epoch.py [--epochs 1] [--train-images 48] [--valid-images 16] \
        [--reference-python REF/bin/python] [--out result.json]

The ratio is reference seconds / detrkit seconds. The floor estimate counts the FLOPs of one
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
    parser.add_argument("--reference-python")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def detrkit_run(args: argparse.Namespace, dataset: Path, output: Path) -> dict:
    from detrkit import RFDETRNano

    model = RFDETRNano(pretrain_weights=None, device="cpu", resolution=args.resolution)
    start = time.perf_counter()
    model.train(dataset_dir=str(dataset), output_dir=str(output), epochs=args.epochs, batch_size=args.batch_size,
                num_workers=args.workers, seed=0, tensorboard=False, progress_bar=None)
    seconds = time.perf_counter() - start
    with open(output / "metrics.csv", newline="") as stream:
        maps = [float(r["val/mAP_50"]) for r in csv.DictReader(stream) if r.get("val/mAP_50")]
    return {"seconds": seconds, "map_50": maps, "step_gflop": step_gflops(model, args)}


def step_gflops(model, args: argparse.Namespace) -> float:
    """FLOPs of one training forward + backward at the nominal resolution (all query groups)."""
    from torch.utils.flop_counter import FlopCounterMode

    detector = model.model.train()
    pixels = torch.randn(args.batch_size, 3, args.resolution, args.resolution)
    with FlopCounterMode(display=False) as counter:
        out = detector(pixels)
        (out.pred_logits.sum() + out.pred_boxes.sum()).backward()
    detector.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 1e9


def reference_run(args: argparse.Namespace, dataset: Path, output: Path) -> dict:
    command = [args.reference_python, str(HERE / "reference_train_epoch.py"), "--dataset", str(dataset),
               "--output", str(output), "--resolution", str(args.resolution), "--batch-size",
               str(args.batch_size), "--epochs", str(args.epochs), "--threads", str(args.threads),
               "--workers", str(args.workers)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
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


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from detrkit.datasets.synthetic import make_synthetic_dataset

    with tempfile.TemporaryDirectory() as scratch:
        dataset = make_synthetic_dataset(Path(scratch) / "data", num_train=args.train_images,
                                         num_valid=args.valid_images, seed=0)
        ours = detrkit_run(args, dataset, Path(scratch) / "detrkit")
        reference = reference_run(args, dataset, Path(scratch) / "reference") if args.reference_python else None
    steps = args.epochs * -(-args.train_images // args.batch_size)
    rate = gemm_rate()
    result = {"epochs": args.epochs, "train_images": args.train_images, "valid_images": args.valid_images,
              "resolution": args.resolution, "batch_size": args.batch_size, "threads": args.threads,
              "detrkit_seconds": ours["seconds"], "detrkit_map_50": ours["map_50"],
              "step_gflop": ours["step_gflop"], "gemm_gflop_per_s": rate,
              "step_floor_s": ours["step_gflop"] / rate, "steps": steps}
    if reference:
        result.update(reference_seconds=reference["seconds"], reference_map_50=reference["map_50"],
                      speedup=reference["seconds"] / ours["seconds"])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
