#!/usr/bin/env python3
"""Augmentation cost per training batch: the Kornia backend against Albumentations, on the CPU.

    python benchmarks/augment.py --threads 2 --batch 8 --size 384 --rounds 5 [--out result.json]

Both backends get the same aug_config (a flip, then each preset), the same uint8 images with
boxes, and produce what the model trains on: normalised float pixels and the moved boxes.
Albumentations runs sample by sample as it does in a loader worker (image to HWC, transforms,
to float, normalise); Kornia runs once on the whole batch as it does after the batch reaches the
device. The resize stage before both is the same and left out. Batch i of a round runs with the
torch seed i on both backends, so both draw their random choices from the same seeds; rounds
alternate between the backends so that machine noise hits both alike. Each reports its mean and
median milliseconds per batch, and `ratio` is Kornia / Albumentations of the means (the goal: at
most 1.2). Both use `--threads` threads. The default clock is the process's CPU time (all its
threads), which other processes on a shared machine barely disturb, and which is the cost that
counts when loader workers and the training step share the cores; `--clock wall` times elapsed
seconds instead.

With `--train-step`, it also times an RF-DETR Nano training step (forward, losses, backward) on
the same batch, and reports `train_ratio` = (step + Kornia) / (step + Albumentations): how much
more CPU a training step costs with the Kornia backend than with Albumentations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import cv2
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from detrkit.datasets.albumentations import AlbumentationsTransform  # noqa: E402
from detrkit.datasets.aug_configs import PRESETS  # noqa: E402
from detrkit.datasets.kornia import KorniaAugment  # noqa: E402
from detrkit.ops.boxes import xyxy_to_cxcywh  # noqa: E402
from detrkit.structures import Batch, Target  # noqa: E402

CONFIGS = {"flip": {"HorizontalFlip": {"p": 0.5}}, **PRESETS}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=384, help="square image side after the resize stage")
    parser.add_argument("--boxes", type=int, default=10, help="boxes per image")
    parser.add_argument("--runs", type=int, default=8, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--device", default="cpu", help="where Kornia runs (Albumentations is always CPU)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--train-step", action="store_true", help="also time a Nano training step")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser.parse_args()


def make_batch(batch: int, size: int, boxes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=generator) for _ in range(batch)]
    corners = torch.rand(batch, boxes, 2, 2, generator=generator) * size
    xyxy = [torch.cat([c.amin(1), c.amax(1) + 4], 1).clamp(max=size) for c in corners]
    return images, xyxy


def albumentations_batch(transform: AlbumentationsTransform, images, xyxy) -> None:
    for image, boxes in zip(images, xyxy):
        sample = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=image.shape[-2:]),
                  "labels": torch.zeros(len(boxes), dtype=torch.int64), "area": torch.ones(len(boxes))}
        transform(tv_tensors.Image(image), sample)


def kornia_batch(augment: KorniaAugment, pixels: torch.Tensor, targets: list[Target]) -> None:
    out = augment(Batch(pixels, None, targets))
    if out.pixels.is_cuda:
        torch.cuda.synchronize()


def times_ms(call, runs: int, clock) -> list[float]:
    times = []
    for seed in range(runs):
        torch.manual_seed(seed)
        start = clock()
        call()
        times.append((clock() - start) * 1000)
    return times


def train_step_ms(pixels: torch.Tensor, targets: list[Target], clock, runs: int = 3) -> float:
    """Mean time of an RF-DETR Nano training step (random weights) on the batch."""
    from detrkit.config import TrainConfig
    from detrkit.losses.criterion import build_criterion
    from detrkit.models.build import build_model
    from detrkit.variants import RFDETRNanoConfig

    config = RFDETRNanoConfig(pretrain_weights=None, num_classes=3, device="cpu",
                              resolution=pixels.shape[-1] // 32 * 32)
    model = build_model(config).train()
    criterion = build_criterion(config, TrainConfig(dataset_dir=None))
    images = (pixels.float() / 255 - 0.45) / 0.225

    def step() -> None:
        model.zero_grad(set_to_none=True)
        criterion(model(images), targets, groups=model.groups).total.backward()
    step()
    return statistics.mean(times_ms(step, runs, clock))


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    images, xyxy = make_batch(args.batch, args.size, args.boxes)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    device = torch.device(args.device)
    pixels = torch.stack(images).to(device)
    scale = torch.tensor([args.size] * 4, dtype=torch.float32)
    targets = [Target(xyxy_to_cxcywh(b) / scale, torch.zeros(len(b), dtype=torch.int64), i, (args.size,) * 2,
                      (args.size,) * 2, torch.ones(len(b))).to(device) for i, b in enumerate(xyxy)]
    results = {}
    for name in args.configs:
        config = CONFIGS[name]
        albu = AlbumentationsTransform(v2.Identity(), config)
        kornia = KorniaAugment(config)
        calls = {"albumentations": lambda: albumentations_batch(albu, images, xyxy),
                 "kornia": lambda: kornia_batch(kornia, pixels, targets)}
        for call in calls.values():  # warm-up
            call()
        times = {backend: [] for backend in calls}
        for _ in range(args.rounds):
            for backend, call in calls.items():
                times[backend] += times_ms(call, args.runs, clock)
        albu_ms, kornia_ms = statistics.mean(times["albumentations"]), statistics.mean(times["kornia"])
        results[name] = {"albumentations_ms": round(albu_ms, 2), "kornia_ms": round(kornia_ms, 2),
                         "albumentations_median_ms": round(statistics.median(times["albumentations"]), 2),
                         "kornia_median_ms": round(statistics.median(times["kornia"]), 2),
                         "ratio": round(kornia_ms / albu_ms, 3), "transforms": list(config)}
        print(f"{name:>12}: albumentations {albu_ms:7.2f} ms  kornia {kornia_ms:7.2f} ms  "
              f"ratio {kornia_ms / albu_ms:.2f}", file=sys.stderr)
    step_ms = None
    if args.train_step:
        step_ms = train_step_ms(pixels.cpu(), [t.to("cpu") for t in targets], clock)
        for result in results.values():
            result["train_ratio"] = round((step_ms + result["kornia_ms"]) / (step_ms + result["albumentations_ms"]), 3)
        print(f"training step {step_ms:.0f} ms", file=sys.stderr)
    report = {"benchmark": "augment", "train_step_ms": step_ms and round(step_ms, 1), "batch": args.batch,
              "size": args.size, "boxes_per_image": args.boxes, "threads": args.threads, "clock": args.clock, "kornia_device": str(device), "torch": torch.__version__,
              "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
