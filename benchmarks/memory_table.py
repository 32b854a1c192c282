#!/usr/bin/env python3
"""Peak GPU memory of one detrkit training step (forward, losses, backward, clipping, AdamW step under
bf16 autocast) per variant at its default resolution and per batch size, with and without gradient
checkpointing.

    python benchmarks/memory_table.py [--out benchmarks/results/memory_table.json] [--device cuda] \\
        [--variants nano small medium large] [--batch-sizes 1 2 4 8 16] [--boxes 6] [--amp bf16] [--smoke]

Each row (variant, gradient_checkpointing) builds a fresh model (random init, three classes) and a fused
AdamW, then for each batch size runs one step to settle the optimizer state and the library workspaces,
and measures the next: `torch.cuda.max_memory_allocated()`/`max_memory_reserved()` over that step, after
`reset_peak_memory_stats()` with the cache emptied. The row stops at the first out-of-memory batch size.
Images are random pixels with `--boxes` random boxes each, so the Hungarian matching and the losses run
as in training. `--smoke` (for a CPU check of the script): Nano at 128 px, batch sizes 1 and 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
MIB = 2**20
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "memory_table.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--variants", nargs="+", default=["nano", "small", "medium", "large"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--boxes", type=int, default=6, help="ground-truth boxes per image")
    parser.add_argument("--amp", choices=sorted(AMP), default="bf16", help="autocast dtype of the forward")
    parser.add_argument("--resolution", type=int, help="override every variant's default resolution")
    parser.add_argument("--smoke", action="store_true", help="tiny settings, for a CPU check of the script")
    parser.add_argument("--print", type=Path, metavar="RESULT", help="only print the table of a result file")
    args = parser.parse_args()
    if args.smoke:
        args.variants, args.batch_sizes, args.resolution = ["nano"], [1, 2], args.resolution or 128
    return args


def build(variant: str, checkpointing: bool, args: argparse.Namespace):
    """Model, criterion and optimizer of one row, as train() would build them on this device."""
    from detrkit.config import TrainConfig
    from detrkit.losses.criterion import build_criterion
    from detrkit.models.build import build_model
    from detrkit.variants import VARIANTS

    extra = {"resolution": args.resolution} if args.resolution else {}
    config = VARIANTS[variant].config_class(pretrain_weights=None, num_classes=3, device=args.device,
                                           gradient_checkpointing=checkpointing, **extra)
    torch.manual_seed(0)
    model = build_model(config).to(args.device).train()
    criterion = build_criterion(config, TrainConfig(dataset_dir=None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4,
                                  fused=torch.device(args.device).type == "cuda" or None)
    return config, model, criterion, optimizer


def random_batch(batch_size: int, side: int, boxes: int, device: str):
    from detrkit.structures import Batch, Target

    generator = torch.Generator().manual_seed(batch_size)
    targets = []
    for index in range(batch_size):
        centre = torch.rand(boxes, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(boxes, 2, generator=generator) * 0.25 + 0.05
        labels = torch.randint(0, 3, (boxes,), generator=generator)
        targets.append(Target(boxes=torch.cat([centre, size], 1), labels=labels, image_id=index,
                              orig_size=(side, side), size=(side, side)))
    return Batch(torch.randn(batch_size, 3, side, side, generator=generator), None, targets).to(device)


def train_step(model, criterion, optimizer, batch, dtype: torch.dtype | None) -> torch.Tensor:
    """One optimizer step as RFDETRModelModule takes it: autocast forward, fp32 losses, clip 0.1."""
    device_type = batch.pixels.device.type
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        outputs = model(batch.pixels, batch.padding)
        with torch.autocast(device_type, enabled=False):
            losses = criterion(outputs, batch.targets, groups=model.groups)
    losses.total.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, foreach=True)
    optimizer.step()
    return losses.total.detach()


def measure(model, criterion, optimizer, batch, dtype: torch.dtype | None) -> dict[str, Any]:
    """Settle with one step, then the peak memory and wall time of the next."""
    cuda = batch.pixels.device.type == "cuda"
    train_step(model, criterion, optimizer, batch, dtype)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated() / MIB if cuda else None
    started = time.perf_counter()
    loss = train_step(model, criterion, optimizer, batch, dtype)
    if cuda:
        torch.cuda.synchronize()
    cell = {"step_s": time.perf_counter() - started, "loss": float(loss), "resident_mib": resident,
            "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB if cuda else None,
            "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB if cuda else None}
    return cell


def row(variant: str, checkpointing: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One variant with or without gradient checkpointing, over the batch sizes up to the first OOM."""
    config, model, criterion, optimizer = build(variant, checkpointing, args)
    result = {"variant": variant, "resolution": config.resolution, "gradient_checkpointing": checkpointing,
              "parameters": sum(p.numel() for p in model.parameters()), "cells": {}}
    for batch_size in args.batch_sizes:
        try:
            batch = random_batch(batch_size, config.resolution, args.boxes, args.device)
            result["cells"][str(batch_size)] = measure(model, criterion, optimizer, batch, AMP[args.amp])
        except torch.OutOfMemoryError:
            result["cells"][str(batch_size)] = {"oom": True}
            result["first_oom_batch_size"] = batch_size
        finally:
            batch = None
            optimizer.zero_grad(set_to_none=True)
            release(args.device)
        print(f"{variant} checkpointing={checkpointing} batch {batch_size}: {result['cells'][str(batch_size)]}",
              file=sys.stderr, flush=True)
        if "first_oom_batch_size" in result:
            break
    return result


def release(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def versions() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "gpu_total_mib": torch.cuda.get_device_properties(0).total_memory / MIB if cuda else None}


def table(rows: list[dict[str, Any]], batch_sizes: list[int]) -> str:
    """Peak allocated GiB per row and batch size ('OOM' where it ran out)."""
    lines = [f"{'variant':<8}{'px':>5}{'ckpt':>6}" + "".join(f"{'b' + str(b):>9}" for b in batch_sizes)]
    for entry in rows:
        cells = []
        for batch_size in batch_sizes:
            cell = entry["cells"].get(str(batch_size))
            peak = cell and cell.get("peak_allocated_mib")
            cells.append("OOM" if cell and cell.get("oom") else "-" if not peak else f"{peak / 1024:.2f}G")
        checkpointing = "on" if entry["gradient_checkpointing"] else "off"
        lines.append(f"{entry['variant']:<8}{entry['resolution']:>5}{checkpointing:>6}"
                     + "".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    if args.print:
        saved = json.loads(args.print.read_text())
        sizes = sorted({int(size) for entry in saved["rows"] for size in entry["cells"]})
        print(table(saved["rows"], sizes))
        return 0
    warnings.filterwarnings("ignore")
    result = {"what": "peak memory of one training step (forward + losses + backward + clip + fused AdamW step) "
                      "after one settling step, random init, three classes",
              "device": args.device, "amp": args.amp, "boxes_per_image": args.boxes, "smoke": args.smoke,
              "versions": versions(), "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:
        for checkpointing in (False, True):
            result["rows"].append(row(variant, checkpointing, args))
            release(args.device)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result["rows"], args.batch_sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
