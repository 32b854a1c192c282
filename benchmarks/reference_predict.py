#!/usr/bin/env python3
"""Time the reference ``rfdetr`` package's plain ``predict()`` on CPU.

This helper is run with the *reference* interpreter (the venv that has
``rfdetr`` installed), never with detrkit's:

    HF_HUB_OFFLINE=1 /work/refvenv/bin/python benchmarks/reference_predict.py \
        --model nano --threads 2 --runs 7 --warmup 2

The model is built with random weights (``pretrain_weights=None``), so nothing
is downloaded.  ``optimize_for_inference()`` is deliberately not called: we
measure the un-optimised ``predict()`` a user gets by default.  The input is a
deterministic random RGB uint8 PIL image (``numpy.random.RandomState(0)``).

Exactly one JSON line is written to stdout; all logging goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = {
    "nano": "RFDETRNano",
    "small": "RFDETRSmall",
    "medium": "RFDETRMedium",
    "large": "RFDETRLarge",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="nano")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads value")
    p.add_argument("--runs", type=int, default=7, help="timed predict() calls")
    p.add_argument("--warmup", type=int, default=2, help="untimed predict() calls before timing")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--threshold", type=float, default=0.5)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    # Keep stdout clean for the single JSON result line.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    warnings.filterwarnings("ignore")
    real_stdout = sys.stdout
    sys.stdout = sys.stderr

    import numpy as np
    import torch
    from PIL import Image

    import rfdetr
    from importlib.metadata import version as _version

    torch.set_num_threads(args.threads)

    model_cls = getattr(rfdetr, MODELS[args.model])
    torch.manual_seed(0)
    model = model_cls(pretrain_weights=None, device="cpu")

    rng = np.random.RandomState(0)
    pixels = rng.randint(0, 256, size=(args.height, args.width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)  # HxWx3 uint8 -> mode "RGB"

    for _ in range(args.warmup):
        model.predict(image, threshold=args.threshold)

    times: list[float] = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        model.predict(image, threshold=args.threshold)
        times.append(time.perf_counter() - t0)

    result = {
        "impl": "reference",
        "model": args.model,
        "threads": args.threads,
        "median_s": statistics.median(times) if times else None,
        "min_s": min(times) if times else None,
        "runs": times,
        "width": args.width,
        "height": args.height,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "rfdetr": _version("rfdetr"),
    }
    sys.stdout = real_stdout
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
