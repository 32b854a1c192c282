#!/usr/bin/env python3
"""Where one training step's time goes: forward/loss/backward/optimizer wall times and the GEMM
rate per matrix shape, for Nano from scratch on random pixels with three boxes per image.

    python benchmarks/step_profile.py [--side 320] [--batch-size 4] [--threads 2] [--steps 6] [--out result.json]

Prints (and with --out writes) JSON: per-step phase times, their median, the step's forward FLOPs by
top-level module, and the matrix products of one profiled step grouped by input shape with their
achieved GFLOP/s, slowest first. The step mirrors train(): all 13 query groups, the criterion,
gradient clipping and AdamW.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def build(args: argparse.Namespace):
    from detrkit import RFDETRNano
    from detrkit.config import TrainConfig
    from detrkit.losses.criterion import build_criterion
    from detrkit.structures import Target

    torch.manual_seed(0)
    model = RFDETRNano(pretrain_weights=None, device="cpu", resolution=320, num_classes=3)
    detector = model.model.train()
    criterion = build_criterion(model.model_config, TrainConfig(dataset_dir="."))
    optimizer = torch.optim.AdamW(detector.parameters(), lr=1e-4)
    side = args.side
    pixels = torch.randn(args.batch_size, 3, side, side)
    boxes = torch.tensor([[0.3, 0.3, 0.1, 0.1], [0.6, 0.5, 0.2, 0.1], [0.5, 0.7, 0.1, 0.2]])
    targets = [Target(image_id=i, boxes=boxes, labels=torch.tensor([0, 1, 2]), size=(side, side),
                      orig_size=(side, side)) for i in range(args.batch_size)]

    def step() -> dict[str, float]:
        marks = [time.perf_counter()]
        out = detector(pixels)
        marks.append(time.perf_counter())
        losses = criterion(out, targets, groups=detector.groups)
        marks.append(time.perf_counter())
        losses.total.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(detector.parameters(), 0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        return dict(zip(("forward", "loss", "backward", "optimizer"), (b - a for a, b in zip(marks, marks[1:]))))

    return detector, pixels, step


def module_gflops(detector, pixels) -> dict[str, float]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, depth=3) as counter:
        detector(pixels)  # forward only: no gradients to clear
    counts = counter.get_flop_counts()
    return {name: round(sum(ops.values()) / 1e9, 2) for name, ops in counts.items() if name.count(".") <= 2}


def gemm_table(step) -> list[dict]:
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        step()
    rows = []
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key not in ("aten::mm", "aten::addmm", "aten::addmm_", "mkldnn::_linear_pointwise"):
            continue
        if event.key == "mkldnn::_linear_pointwise":  # x (M, K) @ weight (N, K).T
            shapes = event.input_shapes[:2]
            (m, k), (n, _) = shapes
        else:
            shapes = event.input_shapes[:2] if event.key == "aten::mm" else event.input_shapes[1:3]
            (m, k), (_, n) = shapes
        seconds = event.self_cpu_time_total / 1e6
        gflop = 2 * m * k * n * event.count / 1e9
        rows.append({"op": event.key, "shapes": shapes, "calls": event.count, "seconds": round(seconds, 4),
                     "gflop": round(gflop, 2), "gflop_per_s": round(gflop / seconds, 1) if seconds else None})
    return sorted(rows, key=lambda row: -row["seconds"])


def main() -> int:
    args = parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    detector, pixels, step = build(args)
    step()  # warm-up: allocations and AdamW state
    phases = [step() for _ in range(args.steps)]
    totals = [sum(p.values()) for p in phases]
    gemms = gemm_table(step)
    gemm_seconds = sum(r["seconds"] for r in gemms)
    gemm_gflop = sum(r["gflop"] for r in gemms)
    result = {"side": args.side, "batch_size": args.batch_size, "threads": args.threads,
              "steps": [{k: round(v, 3) for k, v in p.items()} for p in phases],
              "median_step_s": statistics.median(totals), "min_step_s": min(totals),
              "forward_gflop_by_module": module_gflops(detector, pixels),
              "gemm_seconds": round(gemm_seconds, 3), "gemm_gflop": round(gemm_gflop, 1),
              "gemm_gflop_per_s": round(gemm_gflop / gemm_seconds, 1), "gemms": gemms[:25]}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
