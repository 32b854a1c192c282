#!/usr/bin/env python3
"""Median predict() latency of a detrkit model on one image, its exported files, optionally beside the reference.

    python benchmarks/predict.py --model nano --threads 2 --runs 7 --rounds 3 [--runtimes onnx openvino] \
        [--reference-python /path/to/ref/venv/bin/python] [--out result.json]

--runtimes exports the same model (model.export) to each format and times
detrkit.export.load_exported(file, threads).predict() on the same image, in the same rounds.
`onnx-int8` and `openvino-int8` quantize, calibrated on synthetic shapes. The exports skip their
accuracy check: an untrained model's top detections are near-ties whose order a rounding
difference can change (a random Nano's fp32 ONNX file once matched 79 of 80), so accuracy is
measured on a trained model and real images by benchmarks/export_accuracy.py instead.

Both implementations get random weights and the same deterministic 640x480 RGB image. With a
reference interpreter, rounds alternate between detrkit (in this process) and the reference
(benchmarks/reference_predict.py in a subprocess), so that machine noise hits both alike; the
ratio is reference median / detrkit median. The floor estimate divides the forward's matrix
FLOPs by a measured fp32 GEMM rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
# runtime name -> export() keywords
RUNTIMES = {"onnx": {"format": "onnx"}, "openvino": {"format": "openvino"},
            "onnx-int8": {"format": "onnx", "quantize": "int8"}, "openvino-int8": {"format": "openvino", "quantize": "int8"}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["nano", "small", "medium", "large"], default="nano")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--reference-python", help="interpreter with the reference rfdetr installed")
    parser.add_argument("--runtimes", nargs="*", choices=list(RUNTIMES), default=[],
                        help="also time exported files on these runtimes")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser.parse_args()


def test_image(width: int, height: int) -> Image.Image:
    pixels = np.random.RandomState(0).randint(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def time_calls(call, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def reference_round(args: argparse.Namespace) -> list[float]:
    command = [args.reference_python, str(HERE / "reference_predict.py"), "--model", args.model,
               "--threads", str(args.threads), "--runs", str(args.runs), "--warmup", str(args.warmup),
               "--width", str(args.width), "--height", str(args.height)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["runs"]


def gemm_rate(threads: int) -> float:
    """fp32 GFLOP/s of a ViT-MLP-shaped matrix product on this machine."""
    a, b = torch.randn(1160, 384), torch.randn(384, 1536)
    seconds = statistics.median(time_calls(lambda: a @ b, 20, 3))
    return 2 * 1160 * 384 * 1536 / seconds / 1e9


def forward_gflops(model) -> float:
    """FLOPs of the eval forward at the model resolution, counted by torch on the plain path
    (with autograd on, so that the packed-weight fast path, which torch cannot count, is off)."""
    from torch.utils.flop_counter import FlopCounterMode

    size = model.model_config.resolution
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        model.model.eval()(torch.randn(1, 3, size, size))
    return counter.get_total_flops() / 1e9


def exported_models(model, runtimes: list[str], threads: int) -> dict:
    """The model exported to each runtime's format (in a scratch folder), loaded with `threads`."""
    import tempfile

    from detrkit.export import load_exported

    loaded = {}
    for name in runtimes:
        folder = tempfile.mkdtemp(prefix=f"predict-bench-{name}-")
        loaded[name] = load_exported(model.export(output_dir=folder, check=False, **RUNTIMES[name]), threads=threads)
    return loaded


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from detrkit.variants import VARIANTS

    torch.manual_seed(0)
    model = VARIANTS[args.model](pretrain_weights=None, device="cpu")
    image = test_image(args.width, args.height)
    exported = exported_models(model, args.runtimes, args.threads)
    ours, reference = [], []
    runtime_times: dict[str, list[float]] = {name: [] for name in exported}
    for _ in range(args.rounds):
        ours += time_calls(lambda: model.predict(image, threshold=0.5), args.runs, args.warmup)
        for name, runtime in exported.items():
            runtime_times[name] += time_calls(lambda: runtime.predict(image, threshold=0.5), args.runs, args.warmup)
        if args.reference_python:
            reference += reference_round(args)
    result = {"model": args.model, "threads": args.threads, "image": [args.height, args.width],
              "torch": torch.__version__, "detrkit_median_s": statistics.median(ours),
              "detrkit_min_s": min(ours), "detrkit_runs": ours}
    gflops, rate = forward_gflops(model), gemm_rate(args.threads)
    result.update(forward_gflop=gflops, gemm_gflop_per_s=rate, floor_s=gflops / rate,
                  fraction_of_floor=(gflops / rate) / result["detrkit_median_s"])
    for name, times in runtime_times.items():
        median = statistics.median(times)
        result[name] = {"median_s": median, "min_s": min(times), "runs": times,
                        "fraction_of_floor": (gflops / rate) / median, "speedup_over_pytorch":
                        result["detrkit_median_s"] / median}
    if reference:
        result.update(reference_median_s=statistics.median(reference), reference_min_s=min(reference),
                      reference_runs=reference,
                      speedup=statistics.median(reference) / result["detrkit_median_s"])
        for name in runtime_times:
            result[name]["speedup_over_reference"] = result["reference_median_s"] / result[name]["median_s"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
