#!/usr/bin/env python3
"""Paired-seed learning comparison of detrkit against the reference (issue 26) on small sets of real
photographs, with a data-set maker for them.

    python benchmarks/learning_matrix.py make-data DIR [--set paste|coins] [--train 200] [--valid 50] [--seed 0]
    python benchmarks/learning_matrix.py run --out result.json --reference-python REF/bin/python \
        [--sets paste coins | --dataset NAME=DIR ...] [--train-images 200] [--valid-images 50] \
        [--cells 'default={}' 'tv={"augmentation_backend": "torchvision"}' 'loader@reference-loader={}'] \
        [--multi-scale off on] [--epochs 2 6] [--seeds 0 1 2 3] [--resolution 256] [--batch-size 4] \
        [--device cpu] [--threads 2] [--workers 2] [--jobs 1] [--timeout SECONDS]

Data. `paste` puts 1-6 real objects (6 classes: a cat's face, an espresso cup, a rocket, an
astronaut's face, a space shuttle, a dahlia, cut from photographs with a feathered elliptical
edge, rescaled, flipped, colour-jittered) on crops of real photographs and textures; `coins` puts
3-12 ancient coins (one class, cut out of scikit-image's coins photograph by their own outline,
rotated, tinted) on the same backgrounds. Images are 320-480 px wide JPEGs in Roboflow-COCO layout
(`train/`, `valid/`, `_annotations.coco.json`); the same arguments always write the same files.
The photographs come from the scikit-image 0.26.0 and scikit-learn 1.9.1 wheels (CC0, public
domain and, for china.jpg and flower.jpg, CC BY 2.0; the annotation file's `info` names each
source and licence), read straight from the wheel files, which `pip download` fetches into
--wheels when they are not there; nothing is installed. Where there is no network (a GPU machine),
make the sets beforehand (`run` keeps them under --data-root) and pass them with --dataset NAME=DIR.

Runs. A cell is a pipeline or arm (`NAME=JSON` of train() keywords for both packages;
`NAME@ARM=JSON` trains detrkit through `benchmarks/learning_arms.py ARM`, in the reference's
environment with detrkit's src/ first on the path, beside the plain reference), x multi_scale
off/on (which overrides any multi_scale in the JSON), x a number of epochs, on one data set. Every
seed trains both packages (detrkit through benchmarks/train_epoch.py, the reference through
benchmarks/reference_train_epoch.py, one process each) on the same data; the seed seeds both
packages' initialisation and TrainConfig.seed. Under the managed "step" schedule with its lr_drop
beyond the longest run, nothing in a run depends on its epoch count, so the cells of fewer epochs
are read from the longest run's curve (`"from_run_of_epochs"` says so); otherwise each count is its
own run. The JSON holds, per cell and seed, both packages' validation mAP@50, mAP@75 and
mAP@50:95 after each epoch and the wall time, and per cell and metric the mean paired difference
(detrkit - reference) +- its standard error, at the cell's last epoch and along the curve. It is
rewritten after every run; a rerun with the same --out keeps the runs it already holds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WHEELS = {"scikit-image": "0.26.0", "scikit-learn": "1.9.1"}
WHEELS_DIR = Path(tempfile.gettempdir()) / "detrkit-learning-wheels"  # where those wheels are fetched to
# picture -> (package, member of its wheel, licence)
PICTURES = {
    "chelsea": ("scikit-image", "skimage/data/chelsea.png", "CC0 (Stefan van der Walt)"),
    "coffee": ("scikit-image", "skimage/data/coffee.png", "CC0 (Rachel Michetti)"),
    "rocket": ("scikit-image", "skimage/data/rocket.jpg", "public domain (SpaceX)"),
    "astronaut": ("scikit-image", "skimage/data/astronaut.png", "public domain (NASA)"),
    "coins": ("scikit-image", "skimage/data/coins.png", "no known copyright restrictions"),
    "hubble": ("scikit-image", "skimage/data/hubble_deep_field.jpg", "public domain (NASA)"),
    "retina": ("scikit-image", "skimage/data/retina.jpg", "CC0"),
    "ihc": ("scikit-image", "skimage/data/ihc.png", "no known copyright restrictions"),
    "brick": ("scikit-image", "skimage/data/brick.png", "CC0 (CC0Textures)"),
    "grass": ("scikit-image", "skimage/data/grass.png", "CC0 (CC0Textures)"),
    "gravel": ("scikit-image", "skimage/data/gravel.png", "CC0 (CC0Textures)"),
    "flower": ("scikit-learn", "sklearn/datasets/images/flower.jpg", "CC BY 2.0 (vultilion, Flickr)"),
    "china": ("scikit-learn", "sklearn/datasets/images/china.jpg", "CC BY 2.0 (danielbuechele, Flickr)"),
}
# class -> (picture, the object's box xyxy in the picture's pixels, drawn by hand)
OBJECTS = {"cat": ("chelsea", (20, 10, 420, 300)), "cup": ("coffee", (75, 15, 480, 395)),
           "rocket": ("rocket", (298, 118, 346, 412)), "face": ("astronaut", (150, 15, 310, 185)),
           "shuttle": ("astronaut", (345, 0, 470, 290)), "flower": ("flower", (165, 75, 450, 365))}
BACKGROUNDS = ("china", "hubble", "retina", "ihc", "brick", "grass", "gravel")
SETS = {"paste": {"classes": list(OBJECTS), "objects": (1, 6), "side": (0.15, 0.5), "max_iou": 0.2},
        "coins": {"classes": ["coin"], "objects": (3, 12), "side": (0.07, 0.2), "max_iou": 0.05}}
METRICS = ("map_50", "map_75", "map_50_95")
# settings a kept run must share with a rerun that reuses its --out
RUN_SETTINGS = ("train_images", "valid_images", "data_seed", "resolution", "batch_size", "device", "workers")


# ---- data ------------------------------------------------------------------------------------

def wheel_path(package: str, folder: Path) -> Path:
    """The package's pinned wheel in `folder`, downloaded (not installed) when missing."""
    stem = package.replace("-", "_") + "-" + WHEELS[package] + "-"
    found = sorted(folder.glob(stem + "*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        "-d", str(folder), f"{package}=={WHEELS[package]}"], check=True)
        found = sorted(folder.glob(stem + "*.whl"))
    if not found:
        raise FileNotFoundError(f"no {package} {WHEELS[package]} wheel in {folder}")
    return found[0]


def load_pictures(wheels: Path) -> dict[str, Image.Image]:
    archives = {package: zipfile.ZipFile(wheel_path(package, wheels)) for package in WHEELS}
    return {name: Image.open(io.BytesIO(archives[package].read(member))).convert("RGB")
            for name, (package, member, _) in PICTURES.items()}


def ellipse_alpha(width: int, height: int, feather: float) -> Image.Image:
    alpha = Image.new("L", (width, height), 0)
    inset = max(1, round(feather))
    ImageDraw.Draw(alpha).ellipse((inset, inset, width - 1 - inset, height - 1 - inset), fill=255)
    return alpha.filter(ImageFilter.GaussianBlur(feather / 2))


def coin_cutouts(coins: Image.Image) -> list[tuple[Image.Image, Image.Image]]:
    """Every whole coin of the photograph with its own outline as alpha: the coins are brighter
    than a smooth backdrop, so a threshold over a local minimum separates them."""
    from scipy import ndimage

    grey = np.asarray(coins.convert("L"), dtype=np.float32)
    backdrop = ndimage.uniform_filter(ndimage.minimum_filter(grey, 25), 25)
    mask = ndimage.binary_fill_holes(ndimage.binary_opening(grey - backdrop > 30, iterations=2))
    labels, _ = ndimage.label(mask)
    cutouts = []
    for index, region in enumerate(ndimage.find_objects(labels), start=1):
        rows, cols = region
        inside = labels[region] == index
        touches_edge = rows.start == 0 or cols.start == 0 or rows.stop == grey.shape[0] or cols.stop == grey.shape[1]
        if touches_edge or inside.sum() < 600:
            continue
        alpha = Image.fromarray((inside * 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(1))
        cutouts.append((coins.crop((cols.start, rows.start, cols.stop, rows.stop)), alpha))
    return cutouts


def background(pictures: dict[str, Image.Image], size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A random crop of a random backdrop picture, resized to `size`, tinted and brightened at random."""
    picture = pictures[BACKGROUNDS[rng.integers(len(BACKGROUNDS))]]
    width, height = size
    side = rng.uniform(0.35, 1.0) * min(picture.width, picture.height * width / height)
    crop_w, crop_h = side, side * height / width
    left, top = rng.uniform(0, picture.width - crop_w), rng.uniform(0, picture.height - crop_h)
    image = picture.resize(size, Image.BILINEAR, box=(left, top, left + crop_w, top + crop_h))
    gains = rng.uniform(0.7, 1.15, 3)
    return Image.fromarray(np.clip(np.asarray(image, np.float32) * gains, 0, 255).astype(np.uint8))


def jitter_colour(image: Image.Image, rng: np.random.Generator, tint: bool) -> Image.Image:
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.75, 1.25))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.8, 1.2))
    if tint:  # metal colours for the grey coins
        green = rng.uniform(0.75, 1.0)
        gains = np.array([1.0, green, green * rng.uniform(0.55, 1.0)], np.float32)
        image = Image.fromarray(np.clip(np.asarray(image, np.float32) * gains, 0, 255).astype(np.uint8))
    return image


def object_patch(name: str, pictures: dict[str, Image.Image], cutouts, side: float,
                 rng: np.random.Generator) -> tuple[Image.Image, Image.Image]:
    """(pixels, alpha) of one object instance whose longer side is about `side` pixels."""
    if name == "coin":
        pixels, alpha = cutouts[rng.integers(len(cutouts))]
        angle = rng.uniform(0, 360)
        pixels = pixels.rotate(angle, Image.BILINEAR, expand=True)
        alpha = alpha.rotate(angle, Image.BILINEAR, expand=True)
        tint = True
    else:
        picture, (x0, y0, x1, y1) = OBJECTS[name]
        w, h = x1 - x0, y1 - y0
        box = (x0 + rng.uniform(-0.06, 0.06) * w, y0 + rng.uniform(-0.06, 0.06) * h,
               x1 + rng.uniform(-0.06, 0.06) * w, y1 + rng.uniform(-0.06, 0.06) * h)
        pixels, alpha, tint = pictures[picture].crop(tuple(round(v) for v in box)), None, False
    aspect = math.exp(rng.uniform(-0.2, 0.2))
    scale = side / max(pixels.width * aspect, pixels.height)
    size = (max(4, round(pixels.width * aspect * scale)), max(4, round(pixels.height * scale)))
    pixels = jitter_colour(pixels.resize(size, Image.BILINEAR), rng, tint)
    if alpha is None:
        alpha = ellipse_alpha(*size, feather=max(1.0, 0.04 * min(size)))
    else:
        alpha = alpha.resize(size, Image.BILINEAR)
    if rng.random() < 0.5:
        pixels, alpha = pixels.transpose(Image.FLIP_LEFT_RIGHT), alpha.transpose(Image.FLIP_LEFT_RIGHT)
    return pixels, alpha


def compose(kind: str, pictures, cutouts,
            rng: np.random.Generator) -> tuple[Image.Image, list[tuple[int, list[float]]]]:
    """One image and its (class index, xywh box) objects."""
    spec = SETS[kind]
    width = int(rng.integers(320, 481))
    size = (width, int(round(width * rng.uniform(0.62, 1.0))))
    image = background(pictures, size, rng)
    placed: list[tuple[int, list[float]]] = []
    for _ in range(int(rng.integers(spec["objects"][0], spec["objects"][1] + 1))):
        label = int(rng.integers(len(spec["classes"])))
        side = rng.uniform(*spec["side"]) * min(size)
        pixels, alpha = object_patch(spec["classes"][label], pictures, cutouts, side, rng)
        ys, xs = np.nonzero(np.asarray(alpha) >= 128)  # the box: where the object is more than half opaque
        if len(xs) == 0:
            continue
        for _ in range(20):  # a position overlapping earlier objects little enough
            x = int(rng.integers(0, max(1, size[0] - pixels.width)))
            y = int(rng.integers(0, max(1, size[1] - pixels.height)))
            box = [x + xs.min(), y + ys.min(), x + xs.max() + 1, y + ys.max() + 1]
            box = [min(max(v, 0), size[i % 2]) for i, v in enumerate(box)]
            if all(_iou(box, other) <= spec["max_iou"] for _, other in placed):
                image.paste(pixels, (x, y), alpha)
                placed.append((label, [float(v) for v in box]))
                break
    return image, [(label, [b[0], b[1], b[2] - b[0], b[3] - b[1]]) for label, b in placed]


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def make_dataset(root: Path, kind: str, num_train: int, num_valid: int, seed: int, wheels: Path) -> Path:
    """Write root/{train,valid} as Roboflow-COCO (a parent category 0, classes 1..K)."""
    pictures = load_pictures(wheels)
    cutouts = coin_cutouts(pictures["coins"]) if kind == "coins" else None
    classes = SETS[kind]["classes"]
    categories = [{"id": 0, "name": kind, "supercategory": "none"}]
    categories += [{"id": i + 1, "name": name, "supercategory": kind} for i, name in enumerate(classes)]
    info = {"description": f"learning_matrix.py make-data --set {kind} --seed {seed}",
            "sources": {name: f"{package} {WHEELS[package]} {member}: {licence}"
                        for name, (package, member, licence) in PICTURES.items()}}
    for offset, (split, count) in enumerate((("train", num_train), ("valid", num_valid))):
        rng = np.random.default_rng([seed, offset])
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            image, objects = compose(kind, pictures, cutouts, rng)
            name = f"{split}_{index:04d}.jpg"
            image.save(folder / name, quality=90)
            images.append({"id": index, "file_name": name, "width": image.width, "height": image.height})
            annotations += [{"id": len(annotations) + 1, "image_id": index, "category_id": label + 1,
                             "bbox": [round(v, 2) for v in box], "area": round(box[2] * box[3], 2), "iscrowd": 0}
                            for label, box in objects]
        data = {"info": info, "images": images, "annotations": annotations, "categories": categories}
        (folder / "_annotations.coco.json").write_text(json.dumps(data, indent=1))
    return root


def ensure_dataset(root: Path, kind: str, num_train: int, num_valid: int, seed: int, wheels: Path) -> Path:
    folder = root / f"{kind}-{num_train}-{num_valid}-s{seed}"
    if not (folder / "valid" / "_annotations.coco.json").is_file():
        make_dataset(folder, kind, num_train, num_valid, seed, wheels)
    return folder


# ---- runs ------------------------------------------------------------------------------------

def parse_cell(text: str) -> dict:
    """NAME=JSON or NAME@ARM=JSON -> {"name", "arm", "kwargs"}."""
    name, sep, kwargs = text.partition("=")
    if not sep:
        raise SystemExit(f"a cell is NAME=JSON or NAME@ARM=JSON, got {text!r}")
    name, _, arm = name.partition("@")
    return {"name": name, "arm": arm or None, "kwargs": json.loads(kwargs)}


def epoch_runs(kwargs: dict, epochs: list[int]) -> dict[int, int]:
    """Cell epochs -> epochs of the run it is read from (one run when no setting depends on the count)."""
    drop = kwargs.get("lr_scheduler_kwargs", {}).get("lr_drop", 100)
    shared = (kwargs.get("lr_scheduler", "step") == "step" and drop >= max(epochs)
              and not any(kwargs.get(k) for k in ("early_stopping", "mosaic", "mixup")))
    return {e: max(epochs) if shared else e for e in epochs}


def detrkit_command(args: argparse.Namespace, arm: str | None, data: Path, seed: int, epochs: int,
                    kwargs: dict, out: Path) -> list[str]:
    # an arm imports the reference beside detrkit: it runs in the reference's environment
    script = ["learning_arms.py", arm] if arm else ["train_epoch.py"]
    python = args.reference_python if arm else args.detrkit_python
    return [python, str(HERE / script[0]), *script[1:], "--seeds", str(seed), "--epochs", str(epochs),
            "--dataset", str(data), "--train-images", str(args.train_images), "--valid-images", str(args.valid_images),
            *common_flags(args), "--train-kwargs", json.dumps(kwargs), "--no-count-flops", "--out", str(out)]


def reference_command(args: argparse.Namespace, data: Path, seed: int, epochs: int, kwargs: dict,
                      out: Path) -> list[str]:
    return [args.reference_python, str(HERE / "reference_train_epoch.py"), "--dataset", str(data), "--output", str(out),
            "--epochs", str(epochs), "--seed", str(seed), *common_flags(args), "--train-kwargs", json.dumps(kwargs)]


def common_flags(args: argparse.Namespace) -> list[str]:
    return ["--resolution", str(args.resolution), "--batch-size", str(args.batch_size), "--threads", str(args.threads),
            "--workers", str(args.workers), "--device", args.device]


def run_one(args: argparse.Namespace, job: dict) -> dict:
    """Train one side of one seed; its metric curves and seconds, or the error."""
    with tempfile.TemporaryDirectory(prefix="learning-matrix-") as scratch:
        out = Path(scratch) / ("run.json" if job["side"] == "detrkit" else "output")
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        if job["side"] == "detrkit":
            command = detrkit_command(args, job["arm"], job["data"], job["seed"], job["epochs"], job["kwargs"], out)
            env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        else:
            command = reference_command(args, job["data"], job["seed"], job["epochs"], job["kwargs"], out)
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout} s"}
        if done.returncode:
            return {"error": f"exit status {done.returncode}", "log_tail": done.stderr[-3000:]}
        if job["side"] == "detrkit":
            run = json.loads(out.read_text())["detrkit"]
            return {"seconds": run["per_seed_seconds"][0],
                    **{metric: run[f"per_seed_{metric}"][0] for metric in METRICS}}
        run = json.loads(done.stdout.strip().splitlines()[-1])
        return {"seconds": run["seconds"], **{metric: run[metric] for metric in METRICS}}


def plan(args: argparse.Namespace, datasets: dict[str, Path]) -> tuple[list[dict], dict[str, dict]]:
    """The runs to make (seed-major, detrkit before the reference) and the cells read from them."""
    jobs, cells = [], {}
    for seed in args.seeds:
        for data_name, data in datasets.items():
            for cell in args.cells:
                for scale in args.multi_scale:
                    kwargs = {**cell["kwargs"], "multi_scale": scale == "on"}
                    for epochs, run_epochs in epoch_runs(kwargs, args.epochs).items():
                        base = f"{data_name}|{cell['name']}|ms-{scale}|e{run_epochs}|s{seed}"
                        cells.setdefault(f"{data_name}/{cell['name']}/ms-{scale}/e{epochs}", {
                            "dataset": data_name, "pipeline": cell["name"], "arm": cell["arm"],
                            "multi_scale": scale, "epochs": epochs, "from_run_of_epochs": run_epochs,
                            "train_kwargs": kwargs, "runs": {}})["runs"][str(seed)] = base
                        for side in ("detrkit", "reference"):
                            job = {"key": f"{base}|{side}", "side": side, "arm": cell["arm"], "data": data,
                                   "seed": seed, "epochs": run_epochs, "kwargs": kwargs}
                            if all(j["key"] != job["key"] for j in jobs):
                                jobs.append(job)
    return jobs, cells


def paired(pairs: list[tuple[float, float]]) -> dict:
    diffs = [a - b for a, b in pairs]
    mean = sum(diffs) / len(diffs)
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) if len(diffs) > 1 else float("nan")
    return {"pairs": len(pairs), "detrkit_mean": sum(a for a, _ in pairs) / len(pairs),
            "reference_mean": sum(b for _, b in pairs) / len(pairs), "mean_difference": mean,
            "standard_error": spread / math.sqrt(len(diffs)) if len(diffs) > 1 else None}


def summarise(cells: dict[str, dict], runs: dict[str, dict]) -> dict[str, dict]:
    """Per cell: each seed's curves (cut to the cell's epochs) and the paired differences."""
    summary = {}
    for key, cell in cells.items():
        epochs, seeds = cell["epochs"], {}
        for seed, base in cell["runs"].items():
            sides = {side: runs.get(f"{base}|{side}") for side in ("detrkit", "reference")}
            seeds[seed] = {side: ({"error": run["error"]} if "error" in run else
                                  {"seconds": run["seconds"], **{m: run[m][:epochs] for m in METRICS}})
                           for side, run in sides.items() if run is not None}
        stats = {}
        for metric in METRICS:
            by_epoch = []
            for epoch in range(epochs):
                pairs = [(s["detrkit"][metric][epoch], s["reference"][metric][epoch]) for s in seeds.values()
                         if all(metric in s.get(side, {}) and len(s[side][metric]) > epoch
                                for side in ("detrkit", "reference"))]
                by_epoch.append(paired(pairs) if pairs else None)
            stats[metric] = {"at_epoch": epochs, **(by_epoch[-1] or {"pairs": 0}), "by_epoch": by_epoch}
        summary[key] = {k: v for k, v in cell.items() if k != "runs"} | {"seeds": seeds, "paired": stats}
    return summary


def run_matrix(args: argparse.Namespace) -> int:
    datasets = {name: ensure_dataset(args.data_root, name, args.train_images, args.valid_images, args.data_seed,
                                     args.wheels) for name in args.sets}
    for entry in args.dataset:
        name, _, folder = entry.partition("=")
        datasets[name] = Path(folder).resolve()
    jobs, cells = plan(args, datasets)
    lock = threading.Lock()
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("command", "out")}
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    changed = [k for k in RUN_SETTINGS if k in previous.get("settings", {}) and previous["settings"][k] != settings[k]]
    if changed:
        raise SystemExit(f"{args.out} holds runs made with other {', '.join(changed)}: choose another --out")
    runs = {k: v for k, v in previous.get("runs", {}).items() if "error" not in v}  # failed runs are retried

    def write() -> None:
        result = {"what": "issue 26: validation mAP of detrkit and the reference trained side by side, paired by seed",
                  "settings": settings, "datasets": {k: str(v) for k, v in datasets.items()},
                  "cells": summarise(cells, runs), "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    def work(job: dict) -> None:
        result = run_one(args, job)
        with lock:
            runs[job["key"]] = result
            write()
            shown = result if "error" in result else {m: [round(v, 3) for v in result[m]] for m in ("map_50", "map_75")}
            print(f"{job['key']}: {shown} {result.get('seconds', 0):.0f} s", file=sys.stderr, flush=True)

    todo = [job for job in jobs if job["key"] not in runs]
    print(f"{len(todo)} runs to make ({len(jobs) - len(todo)} kept from {args.out})", file=sys.stderr, flush=True)
    write()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(work, todo))
    for key, cell in summarise(cells, runs).items():
        line = {m: (_rounded(s.get("mean_difference")), _rounded(s.get("standard_error")), s["pairs"])
                for m, s in cell["paired"].items()}
        print(key, "detrkit - reference (mean, SE, pairs):", json.dumps(line))
    return 0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-data", help="write one data set")
    make.add_argument("root", type=Path)
    make.add_argument("--set", choices=list(SETS), default="paste")
    make.add_argument("--train", type=int, default=200)
    make.add_argument("--valid", type=int, default=50)
    make.add_argument("--seed", type=int, default=0)
    run = sub.add_parser("run", help="train the matrix and write the JSON")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--reference-python", required=True)
    run.add_argument("--detrkit-python", default=sys.executable)
    run.add_argument("--sets", nargs="*", choices=list(SETS), default=["paste", "coins"])
    run.add_argument("--dataset", nargs="*", default=[], help="NAME=DIR: an existing Roboflow-COCO data set")
    run.add_argument("--data-root", type=Path, default=Path(tempfile.gettempdir()) / "detrkit-learning-data")
    run.add_argument("--data-seed", type=int, default=0)
    run.add_argument("--train-images", type=int, default=200)
    run.add_argument("--valid-images", type=int, default=50)
    run.add_argument("--cells", nargs="+", type=parse_cell, default=[parse_cell("default={}")])
    run.add_argument("--multi-scale", nargs="+", choices=["off", "on"], default=["off", "on"])
    run.add_argument("--epochs", nargs="+", type=int, default=[2, 6])
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    run.add_argument("--resolution", type=int, default=256)
    run.add_argument("--batch-size", type=int, default=4)
    run.add_argument("--device", default="cpu")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--jobs", type=int, default=1, help="runs at once (1 on a small CPU; several on a GPU)")
    run.add_argument("--timeout", type=float, help="seconds one run may take")
    for command in (make, run):
        command.add_argument("--wheels", type=Path, default=WHEELS_DIR,
                             help="where the scikit-image and scikit-learn wheels are (downloaded when missing)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.command == "make-data":
        make_dataset(args.root, args.set, args.train, args.valid, args.seed, args.wheels)
        print(args.root)
        return 0
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
