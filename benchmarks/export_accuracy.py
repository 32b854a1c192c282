#!/usr/bin/env python3
"""Export a trained checkpoint to each runtime's format and record each export's accuracy check.

    python benchmarks/export_accuracy.py --checkpoint run/checkpoint_best_total.pth --dataset DIR \
        [--runtimes onnx onnx-int8 openvino openvino-int8] [--check-images 50] [--out result.json]

Each export runs model.export(..., dataset_dir=DIR) with its accuracy check on the first
--check-images validation images (int8 files are calibrated on the training split); the JSON holds
each check's report (matched fraction, both mAPs, largest output differences), the time the export
and check took, or the error of an export that failed its check. The README's INT8 figures come
from a Nano trained for 2 epochs on `learning_matrix.py make-data --set paste` (200/50 images).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

RUNTIMES = {"onnx": {"format": "onnx"}, "onnx-int8": {"format": "onnx", "quantize": "int8"},
            "openvino": {"format": "openvino"}, "openvino-int8": {"format": "openvino", "quantize": "int8"}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--runtimes", nargs="*", choices=list(RUNTIMES), default=list(RUNTIMES))
    parser.add_argument("--check-images", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def check_one(model, name: str, dataset: Path, check_images: int) -> dict:
    from detrkit.export import ExportAccuracyError

    folder = Path(tempfile.mkdtemp(prefix=f"export-accuracy-{name}-"))
    start = time.perf_counter()
    try:
        path = model.export(output_dir=folder, dataset_dir=dataset, check_images=check_images, **RUNTIMES[name])
        report = json.loads(Path(f"{path}.check.json").read_text())
    except ExportAccuracyError as error:
        report = {"error": str(error)}
    return report | {"seconds": time.perf_counter() - start}


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from detrkit.detr import from_checkpoint

    model = from_checkpoint(args.checkpoint, device="cpu")
    result = {"checkpoint": str(args.checkpoint), "dataset": str(args.dataset), "torch": torch.__version__,
              "threads": args.threads}
    for name in args.runtimes:
        result[name] = check_one(model, name, args.dataset, args.check_images)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
