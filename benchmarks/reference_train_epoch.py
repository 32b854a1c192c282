#!/usr/bin/env python3
"""Time train() of the reference rfdetr on a data set (run with the reference's interpreter).

    REF/bin/python benchmarks/reference_train_epoch.py --dataset DIR --output DIR [--no-ema] [--seed 0] [--device cpu] \
        [--train-kwargs '{"augmentation_backend": "torchvision"}']

The global torch RNG is seeded with `--seed` before the model is built (weights are initialised at
construction), and the same seed goes to train() as TrainConfig.seed.
Prints one JSON line: {"impl": "reference", "seed": ..., "seconds": ..., "map_50": [...per epoch],
"map_75": [...], "map_50_95": [...]}.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--resolution", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--train-kwargs", default="{}", help="JSON object of further train() keywords")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    import torch
    from rfdetr import RFDETRNano

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = RFDETRNano(pretrain_weights=None, device=args.device, resolution=args.resolution)
    start = time.perf_counter()
    settings = dict(dataset_dir=args.dataset, output_dir=args.output, epochs=args.epochs, batch_size=args.batch_size,
                    num_workers=args.workers, use_ema=args.ema, seed=args.seed, tensorboard=False, progress_bar=None)
    model.train(**{**settings, **json.loads(args.train_kwargs)})
    seconds = time.perf_counter() - start
    with open(os.path.join(args.output, "metrics.csv"), newline="") as stream:
        rows = [r for r in csv.DictReader(stream) if r.get("val/mAP_50")]
    sys.stdout = real_stdout
    print(json.dumps({"impl": "reference", "seed": args.seed, "ema": args.ema, "seconds": seconds,
                      **{key: [float(r[f"val/mAP_{key[4:]}"]) for r in rows]
                         for key in ("map_50", "map_75", "map_50_95")}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
