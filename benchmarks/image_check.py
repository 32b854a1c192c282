#!/usr/bin/env python3
"""Wall time of the up-front image check (detrkit.datasets.image_check) on a folder of small JPEGs.

    python benchmarks/image_check.py [--images 2000 --width 640 --height 480] [--folder DIR] [--out result.json]

Writes `--images` noise JPEGs (quality 90) into `--folder` (a temporary folder by default), then
times: the check with no cache ("cold": every header opened and every file's end read, then the
cache written), the same check again ("cached": one os.stat per file, no image opened), and for
scale the alternatives the check does not use: `Image.verify()` per file and a full decode
(`Image.load()`) per file. The operating system's page cache is warm in every row (the files were
just written); on a cold disk the first check also pays for reading each file's header and end.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from detrkit.datasets.image_cache import CACHE_NAME
from detrkit.datasets.image_check import check_images


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def write_images(folder: Path, count: int, width: int, height: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        path = folder / f"{index:05d}.jpg"
        if not path.exists():
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def per_file(paths: list[Path], method: str) -> None:
    for path in paths:
        with Image.open(path) as image:
            getattr(image, method)()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch) / "images"
        paths = write_images(folder, args.images, args.width, args.height)
        (folder / CACHE_NAME).unlink(missing_ok=True)
        listed = [(path, (args.height, args.width)) for path in paths]
        seconds = {
            "check_cold": timed(lambda: check_images(listed, folder, "bench")),
            "check_cached": timed(lambda: check_images(listed, folder, "bench")),
            "verify_each": timed(lambda: per_file(paths, "verify")),
            "full_decode_each": timed(lambda: per_file(paths, "load")),
        }
        megabytes = sum(path.stat().st_size for path in paths) / 2**20
    result = {"images": args.images, "size": [args.width, args.height], "megabytes": round(megabytes, 1),
              "seconds": {key: round(value, 4) for key, value in seconds.items()},
              "microseconds_per_image": {key: round(value / args.images * 1e6, 1) for key, value in seconds.items()},
              "python": platform.python_version(), "pillow": Image.__version__, "machine": platform.machine()}
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
