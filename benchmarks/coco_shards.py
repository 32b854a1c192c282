#!/usr/bin/env python3
"""Write a large synthetic COCO folder fast: detrkit's make_synthetic_dataset in parallel shards, merged.

    python benchmarks/coco_shards.py DIR --train 2400 [--valid 16] [--image-size 640 480] [--processes 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ANNOTATIONS = "_annotations.coco.json"  # the Roboflow COCO file name both packages read


def write_dataset(root: Path, num_train: int, num_valid: int, image_size: tuple[int, int], processes: int) -> Path:
    """make_synthetic_dataset in `processes` shards at once (seeds 0, 1, ...), merged into `root`:
    train/ gets every shard's images (renamed per shard), valid/ shard 0's."""
    shards = max(1, min(processes, num_train // 64))
    counts = [num_train // shards + (k < num_train % shards) for k in range(shards)]
    jobs = [(str(root.parent / f"{root.name}-shard{k}"), count, num_valid if k == 0 else 0, tuple(image_size), k)
            for k, count in enumerate(counts)]
    with ProcessPoolExecutor(shards) as pool:
        folders = [Path(folder) for folder in pool.map(_write_shard, jobs)]
    (root / "train").mkdir(parents=True, exist_ok=True)
    shutil.move(str(folders[0] / "valid"), str(root / "valid"))
    merged: dict[str, Any] | None = None
    for k, folder in enumerate(folders):
        data = json.loads((folder / "train" / ANNOTATIONS).read_text())
        merged = merged or {**data, "images": [], "annotations": []}
        ids = {}
        for image in data["images"]:
            name = f"s{k:02d}_{image['file_name']}"
            shutil.move(str(folder / "train" / image["file_name"]), str(root / "train" / name))
            ids[image["id"]] = len(merged["images"])
            merged["images"].append({**image, "id": ids[image["id"]], "file_name": name})
        for annotation in data["annotations"]:
            merged["annotations"].append({**annotation, "id": len(merged["annotations"]),
                                          "image_id": ids[annotation["image_id"]]})
        shutil.rmtree(folder)
    (root / "train" / ANNOTATIONS).write_text(json.dumps(merged))
    return root


def _write_shard(job: tuple) -> str:
    from detrkit.datasets.synthetic import make_synthetic_dataset

    folder, num_train, num_valid, image_size, seed = job
    make_synthetic_dataset(folder, num_train=num_train, num_valid=num_valid, image_size=image_size, seed=seed)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--train", type=int, required=True)
    parser.add_argument("--valid", type=int, default=16)
    parser.add_argument("--image-size", type=int, nargs=2, default=(640, 480), metavar=("W", "H"))
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(write_dataset(args.root, args.train, args.valid, tuple(args.image_size), args.processes))


if __name__ == "__main__":
    main()
