#!/usr/bin/env python3
"""Does mosaic or mixup help? Train the same small model on the same few images of small objects
with and without them (same seeds) and compare validation mAP.

    python benchmarks/mixing_experiment.py --epochs 8 --seeds 0 [--out result.json]

The data are generated shapes whose sides are 5-12% of the image's shorter side, at 320 x 240,
trained at 192 px (objects of about 10 to 23 px); the model is a small RF-DETR (MODEL below)
from random weights. Conditions: none, mosaic 0.5, mixup 0.3, both; each closes mosaic and mixup
for the last `--close` epochs. Prints the JSON with mAP by epoch and the best and final mAP.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

CONDITIONS = {"none": {}, "mosaic": {"mosaic": 0.5}, "mixup": {"mixup": 0.3}, "both": {"mosaic": 0.5, "mixup": 0.3}}
# a small RF-DETR (4 of 12 encoder blocks at width 192) that trains in minutes on two CPU cores
MODEL = dict(pretrain_weights=None, resolution=192, encoder_layers=4, encoder_width=192, encoder_heads=3,
             out_feature_indexes=[2, 4], hidden_dim=128, dim_feedforward=512, num_queries=40, num_select=40,
             group_detr=3, device="cpu")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--close", type=int, default=2, help="close_mosaic_epochs")
    parser.add_argument("--train-images", type=int, default=32)
    parser.add_argument("--valid-images", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--conditions", nargs="*", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def validation(metrics_csv: Path) -> list[dict[str, float]]:
    with open(metrics_csv, newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get("val/mAP_50_95")]
    return [{"mAP_50_95": float(row["val/mAP_50_95"]), "mAP_50": float(row["val/mAP_50"])} for row in rows]


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")
    from detrkit.datasets import synthetic
    from detrkit.variants import RFDETRNano

    synthetic.SIDE_RANGE = (0.05, 0.12)  # small objects
    root = Path(tempfile.mkdtemp(prefix="mixing-"))
    data = synthetic.make_synthetic_dataset(root / "data", num_train=args.train_images, num_valid=args.valid_images,
                                            min_objects=3, max_objects=8, seed=0)
    runs = []
    for seed in args.seeds:
        for name in args.conditions:
            started = time.perf_counter()
            model = RFDETRNano(**MODEL)
            output = root / f"{name}-{seed}"
            model.train(dataset_dir=str(data), output_dir=str(output), epochs=args.epochs, batch_size=4, lr=4e-4,
                        lr_encoder=4e-4, multi_scale="off", scale_jitter=False, num_workers=args.workers,
                        progress_bar=None, tensorboard=False, seed=seed, close_mosaic_epochs=args.close,
                        **CONDITIONS[name])
            history = validation(output / "metrics.csv")
            seconds = round(time.perf_counter() - started)
            runs.append({"condition": name, "seed": seed, **CONDITIONS[name], "seconds": seconds,
                         "map_50_95_by_epoch": [round(h["mAP_50_95"], 4) for h in history],
                         "final_map_50_95": round(history[-1]["mAP_50_95"], 4),
                         "final_map_50": round(history[-1]["mAP_50"], 4),
                         "best_map_50_95": round(max(h["mAP_50_95"] for h in history), 4)})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    report = {"experiment": "mosaic_mixup", "epochs": args.epochs, "close_mosaic_epochs": args.close,
              "train_images": args.train_images, "valid_images": args.valid_images, "object_side": "5-12%",
              "image": "320x240", "resolution": MODEL["resolution"], "runs": runs}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
