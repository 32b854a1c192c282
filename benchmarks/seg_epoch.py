#!/usr/bin/env python3
"""Segmentation speed and memory (issue 20): one RFDETRSegNano training epoch, its validation, a validation-only
pass and the training step's RSS high-water, detrkit beside the reference rfdetr in one run, on a small set of
real photographs with instance masks.

    python benchmarks/seg_epoch.py [--images 32] [--valid-images 16] [--resolution 312] [--epochs 1] \
        [--batch-size 4] [--workers 0] [--threads 2] [--ema | --no-ema] [--repeats 1] [--seed 0] \
        [--reference-python ~/.cache/rfdetr-reference/bin/python] [--dataset DIR] [--out result.json]
    python benchmarks/seg_epoch.py make-data DIR [--images 32] [--valid-images 16] [--seed 0]

Data. The `coins` scenes of benchmarks/learning_matrix.py (3-12 ancient coins cut out of scikit-image's coins
photograph by their own outline, rotated and tinted, on crops of real photographs and textures, read from the
pinned scikit-image/scikit-learn wheels), with each coin's mask: the pasted cut-out's alpha >= 128, less what
coins pasted later cover, written as COCO polygons (OpenCV's outer contours). Roboflow-COCO layout
(`train/`, `valid/`, `_annotations.coco.json`), so both packages read the folder unchanged; the same
arguments always write the same files.

Runs. Each repeat trains a randomly initialised RFDETRSegNano once with each package, each in a fresh
process (benchmarks/seg_epoch_side.py, run by that package's interpreter), with identical train() settings:
multi_scale off, default augmentation, EMA as --ema (on by default in both packages), torch threads and data
workers as given. Repeats alternate which package goes first. The side script reports train()'s wall time,
the training loop (first step start to last step end) and each step, the in-fit validation (Lightning's
validation loop: forward, mask post-processing, box and mask mAP), a second validation-only pass with the
fitted Trainer, and the RSS high-water marks (ru_maxrss) before the first step, after the last step and
after validation.

Learning. Each run keeps the mAP metrics of every in-fit validation (val/segm_mAP_50, the mask mAP@50 both
packages log, val/segm_mAP_50_95 and the box val/mAP_50); "learning" pairs the runs of each seed and gives,
after the last epoch, both means and the mean paired difference (detrkit - reference) with its standard
error. The learning comparison of issue 20 is this benchmark with more images, epochs and repeats:

    python benchmarks/seg_epoch.py --images 100 --valid-images 25 --epochs 2 --repeats 3 --out seg_learning.json

Ratios are reference / detrkit for times (above 1: detrkit is faster) and detrkit / reference for memory
(below 1: detrkit uses less), from the means over repeats. The JSON is rewritten after every run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from learning_matrix import (
    PICTURES,
    WHEELS,
    WHEELS_DIR,
    _iou,
    background,
    coin_cutouts,
    load_pictures,
    object_patch,
)

DEFAULT_REFERENCE = Path.home() / ".cache" / "rfdetr-reference" / "bin" / "python"
MIN_AREA = 40  # pixels: a coin covered down to less than this is dropped


# ---- data ------------------------------------------------------------------------------------

def compose(pictures, cutouts, rng: np.random.Generator,
            widths: tuple[int, int] = (320, 480)) -> tuple[Image.Image, list[np.ndarray]]:
    """One image, `widths[0]` to `widths[1]` pixels wide, and the visible mask (H, W) bool of each coin on it."""
    width = int(rng.integers(widths[0], widths[1] + 1))
    size = (width, round(width * rng.uniform(0.62, 1.0)))
    image = background(pictures, size, rng)
    masks: list[np.ndarray] = []
    boxes: list[list[float]] = []
    for _ in range(int(rng.integers(3, 13))):
        side = rng.uniform(0.07, 0.2) * min(size)
        pixels, alpha = object_patch("coin", pictures, cutouts, side, rng)
        solid = np.asarray(alpha) >= 128
        ys, xs = np.nonzero(solid)
        if len(xs) == 0:
            continue
        for _ in range(20):  # a position overlapping earlier coins little enough
            x = int(rng.integers(0, max(1, size[0] - pixels.width)))
            y = int(rng.integers(0, max(1, size[1] - pixels.height)))
            box = [x + xs.min(), y + ys.min(), x + xs.max() + 1, y + ys.max() + 1]
            if all(_iou(box, other) <= 0.05 for other in boxes):
                image.paste(pixels, (x, y), alpha)
                mask = np.zeros((size[1], size[0]), bool)
                h, w = min(solid.shape[0], size[1] - y), min(solid.shape[1], size[0] - x)
                mask[y:y + h, x:x + w] = solid[:h, :w]
                masks = [m & ~mask for m in masks]  # the new coin covers the ones beneath it
                masks.append(mask)
                boxes.append(box)
                break
    return image, [m for m in masks if m.sum() >= MIN_AREA]


def polygons(mask: np.ndarray) -> list[list[float]]:
    """COCO polygons [[x1, y1, x2, y2, ...], ...] of the mask's outer contours (pixel corners)."""
    import cv2

    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [[round(float(v), 1) for v in c.reshape(-1)] for c in contours if len(c) >= 3]


def make_dataset(root: Path, num_train: int, num_valid: int, seed: int, wheels: Path,
                 widths: tuple[int, int] = (320, 480)) -> Path:
    """Write root/{train,valid} as Roboflow-COCO with polygon masks (a parent category 0, class 1 `coin`)."""
    pictures = load_pictures(wheels)
    cutouts = coin_cutouts(pictures["coins"])
    categories = [{"id": 0, "name": "coins", "supercategory": "none"},
                  {"id": 1, "name": "coin", "supercategory": "coins"}]
    info = {"description": f"seg_epoch.py make-data --images {num_train} --valid-images {num_valid} --seed {seed} "
                           f"--image-width {widths[0]} {widths[1]}",
            "sources": {name: f"{package} {WHEELS[package]} {member}: {licence}"
                        for name, (package, member, licence) in PICTURES.items()}}
    for offset, (split, count) in enumerate((("train", num_train), ("valid", num_valid))):
        rng = np.random.default_rng([seed, offset, 20])
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            image, masks = compose(pictures, cutouts, rng, widths)
            name = f"{split}_{index:04d}.jpg"
            image.save(folder / name, quality=90)
            images.append({"id": index, "file_name": name, "width": image.width, "height": image.height})
            for mask in masks:
                ys, xs = np.nonzero(mask)
                box = [float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())]
                annotations.append({"id": len(annotations) + 1, "image_id": index, "category_id": 1, "bbox": box,
                                    "area": float(mask.sum()), "segmentation": polygons(mask), "iscrowd": 0})
        data = {"info": info, "images": images, "annotations": annotations, "categories": categories}
        (folder / "_annotations.coco.json").write_text(json.dumps(data))
    return root


# ---- runs ------------------------------------------------------------------------------------

def run_side(args: argparse.Namespace, package: str, dataset: Path, seed: int) -> dict:
    python = args.reference_python if package == "rfdetr" else args.detrkit_python
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(args.threads))
    if package == "detrkit":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory(prefix=f"seg-epoch-{package}-") as scratch:
        command = [str(python), str(HERE / "seg_epoch_side.py"), "--package", package, "--dataset", str(dataset),
                   "--output", scratch, "--resolution", str(args.resolution), "--batch-size", str(args.batch_size),
                   "--epochs", str(args.epochs), "--threads", str(args.threads), "--workers", str(args.workers),
                   "--seed", str(seed), "--ema" if args.ema else "--no-ema"]
        load = os.getloadavg()[0]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO,
                              check=False)
    if done.returncode:
        return {"error": f"exit status {done.returncode}", "log_tail": done.stderr[-4000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_average_at_start"] = load
    return result


def side_summary(runs: list[dict]) -> dict | None:
    """Means over a side's successful runs of the numbers the ratios use."""
    runs = [r for r in runs if "error" not in r]
    if not runs:
        return None

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    epochs = [r["epochs"][0] for r in runs]
    return {"runs": len(runs), "train_s": mean(r["train_s"] for r in runs),
            "train_loop_s": mean(e["train_loop_s"] for e in epochs),
            "median_step_s": mean(statistics.median(e["step_s"][1:] or e["step_s"]) for e in epochs),
            "first_step_s": mean(e["step_s"][0] for e in epochs),
            "validation_s": mean(e["validation_s"] for e in epochs),
            "revalidate_s": mean(r.get("revalidate_s") for r in runs),
            "revalidate_loop_s": mean(r.get("revalidate_loop_s") for r in runs),
            "max_rss_before_steps_mib": mean(e["max_rss_at_epoch_start_mib"] for e in epochs),
            "max_rss_after_steps_mib": mean(e["max_rss_after_steps_mib"] for e in epochs),
            "step_rss_rise_mib": mean(e["max_rss_after_steps_mib"] - e["rss_at_epoch_start_mib"] for e in epochs),
            "max_rss_after_validation_mib": mean(e["max_rss_after_validation_mib"] for e in epochs),
            "max_rss_end_mib": mean(max(m["max_rss_mib"] for m in r["memory"].values()) for r in runs),
            "validation_to_step_ratio": mean(e["validation_s"] / statistics.median(e["step_s"]) for e in epochs
                                             if e["validation_s"] and e["step_s"])}


LEARNING_KEYS = ("val/segm_mAP_50", "val/segm_mAP_50_95", "val/mAP_50")


def learning(runs: dict[str, list[dict]]) -> dict:
    """Per seed, both packages' in-fit validation metrics after each epoch, and per metric the mean paired
    difference (detrkit - reference) after the last epoch with its standard error."""
    def curves(run: dict) -> dict[str, list]:
        return {key: [(e.get("metrics") or {}).get(key) for e in run["epochs"]] for key in LEARNING_KEYS}

    by_seed: dict[int, dict] = {}
    for package in ("detrkit", "rfdetr"):
        for run in runs[package]:
            if "error" not in run:
                by_seed.setdefault(run["seed"], {})[package] = curves(run)
    pairs = {seed: both for seed, both in sorted(by_seed.items()) if len(both) == 2}
    summary = {}
    for key in LEARNING_KEYS:
        diffs = [both["detrkit"][key][-1] - both["rfdetr"][key][-1] for both in pairs.values()
                 if both["detrkit"][key][-1] is not None and both["rfdetr"][key][-1] is not None]
        if diffs:
            summary[key] = {
                "detrkit_mean": statistics.fmean(b["detrkit"][key][-1] for b in pairs.values()),
                "reference_mean": statistics.fmean(b["rfdetr"][key][-1] for b in pairs.values()),
                "mean_difference": statistics.fmean(diffs),
                "standard_error": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
                "seeds": len(diffs)}
    return {"per_seed": pairs, "last_epoch": summary}


def ratios(ours: dict | None, theirs: dict | None) -> dict:
    if not ours or not theirs:
        return {}
    faster = {f"{key}_speedup": theirs[key] / ours[key] for key in
              ("train_s", "train_loop_s", "median_step_s", "validation_s", "revalidate_s", "revalidate_loop_s")
              if ours.get(key) and theirs.get(key)}
    memory = {f"{key}_ratio": ours[key] / theirs[key] for key in
              ("max_rss_after_steps_mib", "step_rss_rise_mib", "max_rss_after_validation_mib", "max_rss_end_mib")
              if ours.get(key) and theirs.get(key)}
    return {**faster, **memory}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "make-data"], default="run")
    parser.add_argument("root", nargs="?", type=Path, help="make-data: the folder to write")
    parser.add_argument("--images", type=int, default=32, help="training images")
    parser.add_argument("--valid-images", type=int, default=16)
    parser.add_argument("--resolution", type=int, default=312)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0, help="data workers (0 keeps loading in the measured process)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in both processes")
    parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="model seed of the first repeat (then seed+1, ...)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--image-width", type=int, nargs=2, default=[320, 480], metavar=("MIN", "MAX"),
                        help="generated images are MIN to MAX pixels wide (height 0.62-1.0 of the width)")
    parser.add_argument("--reference-python", type=Path, default=DEFAULT_REFERENCE)
    parser.add_argument("--detrkit-python", type=Path, default=Path(sys.executable))
    parser.add_argument("--dataset", type=Path, help="use this Roboflow-COCO folder instead of generating one")
    parser.add_argument("--wheels", type=Path, default=WHEELS_DIR)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.command == "make-data":
        if args.root is None:
            raise SystemExit("make-data needs the folder to write")
        print(make_dataset(args.root, args.images, args.valid_images, args.data_seed, args.wheels,
                           tuple(args.image_width)))
        return 0
    runs: dict[str, list[dict]] = {"detrkit": [], "rfdetr": []}
    started = time.time()

    def emit() -> str:
        ours, theirs = side_summary(runs["detrkit"]), side_summary(runs["rfdetr"])
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                    if k not in ("command", "root", "out")}
        result = {"what": "issue 20: RFDETRSegNano epoch, validation and step memory, detrkit beside rfdetr 1.11.2",
                  "model": "RFDETRSegNano", "settings": settings, "cpu_count": os.cpu_count(),
                  "wall_s": time.time() - started, "detrkit": ours, "reference": theirs,
                  "ratios": ratios(ours, theirs), "learning": learning(runs), "runs": runs}
        text = json.dumps(result, indent=1)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        return text

    with tempfile.TemporaryDirectory(prefix="seg-epoch-data-") as scratch:
        dataset = args.dataset or make_dataset(Path(scratch), args.images, args.valid_images, args.data_seed,
                                               args.wheels, tuple(args.image_width))
        for repeat in range(args.repeats):
            seed = args.seed + repeat
            order = ("detrkit", "rfdetr") if repeat % 2 == 0 else ("rfdetr", "detrkit")
            for package in order:
                result = run_side(args, package, dataset, seed)
                runs[package].append(result)
                shown = result.get("error") or (f"train() {result['train_s']:.1f} s, validation "
                                                f"{result['epochs'][0]['validation_s']}")
                print(f"{package} seed {seed}: {shown}", file=sys.stderr, flush=True)
                emit()
    print(json.dumps(ratios(side_summary(runs["detrkit"]), side_summary(runs["rfdetr"])), indent=1))
    emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
