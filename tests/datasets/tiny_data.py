"""Writers of tiny on-disk data sets for the dataset tests: noise images and COCO files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

CATEGORIES = [{"id": 1, "name": "cat", "supercategory": "animal"},
              {"id": 2, "name": "dog", "supercategory": "animal"}]


def write_image(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A noise PNG (or JPEG, by suffix): no symmetry, so flips are visible."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def coco_file(folder: Path, annotations: list[dict], categories: list[dict] | None = None,
              images: list[dict] | None = None, name: str = "_annotations.coco.json") -> Path:
    """Write a COCO json in `folder` and the images it lists (default: one 200x100 image, id 1)."""
    images = images if images is not None else [{"id": 1, "file_name": "a.png", "width": 200, "height": 100}]
    for index, image in enumerate(images):
        if not (folder / image["file_name"]).exists():
            write_image(folder / image["file_name"], image["width"], image["height"], seed=index)
    data = {"images": images, "annotations": annotations,
            "categories": categories if categories is not None else CATEGORIES}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder / name


def annotation(ident: int, bbox: list[float], category_id: int = 1, image_id: int = 1, **extra) -> dict:
    return {"id": ident, "image_id": image_id, "category_id": category_id, "bbox": bbox, **extra}


# a.png's labels in the YOLO fixtures: a box and a polygon (bounds x 0.1..0.3, y 0.2..0.6)
YOLO_LABELS = "0 0.5 0.5 0.2 0.4\n1 0.1 0.2 0.3 0.2 0.2 0.6\n"


def ultralytics_yolo(root: Path, data_yaml: str, splits: tuple[str, ...] = ("train", "val")) -> Path:
    """Ultralytics layout: images/<split>/{a,b}.png (100x50), labels/<split>/a.txt, and data.yaml
    with the given text; b.png is background."""
    for split in splits:
        write_image(root / "images" / split / "a.png", 100, 50)
        write_image(root / "images" / split / "b.png", 100, 50, seed=1)
        (root / "labels" / split).mkdir(parents=True)
        (root / "labels" / split / "a.txt").write_text(YOLO_LABELS)
    (root / "data.yaml").write_text(data_yaml)
    return root
