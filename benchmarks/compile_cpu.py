#!/usr/bin/env python3
"""Eager against compiled (`compile_detector`) on the CPU: a training step and predict()-style
inference of RF-DETR Nano, interleaved A/B in one process.

    python benchmarks/compile_cpu.py [--train-side 320] [--batch-size 2] [--infer-side 384]
                                     [--repeats 7] [--threads 2] [--dynamic] [--plain-eager] [--out result.json]

The training step is the detector's forward, the criterion (`build_criterion`) and backward, all 13
query groups, three boxes per image; no optimizer step (it does not change with compilation).
Inference is the detector in eval mode under `torch.inference_mode()`, batch 1. Both variants hold
the same weights. Each repeat times one eager and one compiled call, alternating which goes first,
so load from other processes hits both alike; the result gives medians, the per-repeat
compiled/eager ratio (median, min, max) and the first compiled call (compilation start-up).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-side", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--infer-side", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dynamic", action="store_true", help="compile for dynamic shapes (default: static)")
    parser.add_argument("--plain-eager", action="store_true",
                        help="eager runs plain aten products, as compiled graphs do, instead of oneDNN's")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-infer", action="store_true")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def build_detectors(dynamic: bool):
    from detrkit import RFDETRNano
    from detrkit.training.accel.compile import CompileMode, compile_detector

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = RFDETRNano(pretrain_weights=None, device="cpu", num_classes=3)
    eager = model.model
    compiled = compile_detector(copy.deepcopy(eager), CompileMode(dynamic, "benchmark"))
    return model, eager, compiled


def training_step(detector, criterion, pixels, targets) -> Callable[[], None]:
    def step() -> None:
        out = detector(pixels)
        criterion(out, targets, groups=detector.groups).total.backward()

    def clear() -> None:
        detector.zero_grad(set_to_none=True)

    step.clear = clear
    return step


def inference(detector, pixels) -> Callable[[], None]:
    def run() -> None:
        with torch.inference_mode():
            detector(pixels)

    run.clear = lambda: None
    return run


def timed(fn: Callable[[], None]) -> float:
    fn.clear()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(eager: Callable[[], None], compiled: Callable[[], None], repeats: int) -> dict:
    """First calls (eager warm-up, compiled start-up), then `repeats` interleaved pairs."""
    first_eager = timed(eager)
    first_compiled = timed(compiled)
    timed(compiled)  # a second call may still record guards or recompile once
    pairs = []
    for repeat in range(repeats):
        if repeat % 2:
            c, e = timed(compiled), timed(eager)
        else:
            e, c = timed(eager), timed(compiled)
        pairs.append((e, c))
    eager_s = [e for e, _ in pairs]
    compiled_s = [c for _, c in pairs]
    ratios = [c / e for e, c in pairs]
    return {
        "first_call_eager_s": round(first_eager, 3),
        "first_call_compiled_s": round(first_compiled, 3),
        "startup_s": round(first_compiled - statistics.median(compiled_s), 2),
        "eager_median_s": round(statistics.median(eager_s), 4),
        "compiled_median_s": round(statistics.median(compiled_s), 4),
        "eager_s": [round(t, 4) for t in eager_s],
        "compiled_s": [round(t, 4) for t in compiled_s],
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.plain_eager:
        import detrkit.ops.linear

        detrkit.ops.linear.plain_ops_needed = lambda: True  # every oneDNN path checks it at call time
    from detrkit.config import TrainConfig
    from detrkit.losses.criterion import build_criterion
    from detrkit.structures import Target

    model, eager, compiled = build_detectors(args.dynamic)
    result = {"torch": torch.__version__, "threads": args.threads, "dynamic": args.dynamic,
              "plain_eager": args.plain_eager,
              "cpu": _cpu_name(), "repeats": args.repeats}
    if not args.skip_train:
        side, batch = args.train_side, args.batch_size
        criterion = build_criterion(model.model_config, TrainConfig(dataset_dir=".", multi_scale="off"))
        pixels = torch.randn(batch, 3, side, side)
        boxes = torch.tensor([[0.3, 0.3, 0.1, 0.1], [0.6, 0.5, 0.2, 0.1], [0.5, 0.7, 0.1, 0.2]])
        targets = [Target(boxes=boxes, labels=torch.tensor([0, 1, 2]), image_id=i, orig_size=(side, side),
                          size=(side, side)) for i in range(batch)]
        eager.train(), compiled.train()
        result["train_step"] = {"side": side, "batch_size": batch, **compare(
            training_step(eager, criterion, pixels, targets), training_step(compiled, criterion, pixels, targets),
            args.repeats)}
        print(json.dumps(result["train_step"]), file=sys.stderr, flush=True)
    if not args.skip_infer:
        pixels = torch.randn(1, 3, args.infer_side, args.infer_side)
        eager.eval(), compiled.eval()
        result["inference"] = {"side": args.infer_side, "batch_size": 1, **compare(
            inference(eager, pixels), inference(compiled, pixels), args.repeats)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
