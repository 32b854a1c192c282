"""Write a small Roboflow-COCO data set of coloured shapes on noisy backgrounds (the demo data)."""

from __future__ import annotations

import colorsys
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from detrkit.datasets.coco import ROBOFLOW_ANNOTATIONS

SHAPES = ("circle", "square", "triangle", "diamond")  # class i is drawn as SHAPES[i % 4]
SIDE_RANGE = (0.10, 0.30)  # object side as a fraction of the image's shorter side
PARENT = "shapes"  # Roboflow-style root category, dropped by the reader


def make_synthetic_dataset(root: str | os.PathLike, num_train: int = 48, num_valid: int = 16, num_test: int = 0,
                           image_size: tuple[int, int] = (320, 240),
                           classes: Sequence[str] = ("circle", "square", "triangle"),
                           min_objects: int = 1, max_objects: int = 6, seed: int = 0) -> Path:
    """Write `root/{train,valid[,test]}` (JPEGs + _annotations.coco.json); image_size is (W, H).
    Class i has its own hue and shape; the same arguments always write the same files."""
    width, height = image_size
    counts = {"train": num_train, "valid": num_valid, "test": num_test}
    if not classes or min(width, height) < 32 or not 1 <= min_objects <= max_objects or min(counts.values()) < 0:
        raise ValueError(f"need classes, an image of at least 32x32, 1 <= min_objects <= max_objects and "
                         f"image counts >= 0; got {list(classes)}, {image_size}, {min_objects}..{max_objects}, "
                         f"{counts}")
    root = Path(root)
    for offset, (split, count) in enumerate(counts.items()):
        if split == "test" and count == 0:
            continue
        rng = np.random.default_rng([seed, offset])
        _write_split(root / split, count, (width, height), list(classes), (min_objects, max_objects), rng)
    return root


def _write_split(folder: Path, count: int, size: tuple[int, int], classes: list[str],
                 objects: tuple[int, int], rng: np.random.Generator) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for image_id in range(count):
        image, shapes = _draw_image(size, len(classes), objects, rng)
        name = f"shapes_{image_id:05d}.jpg"
        image.save(folder / name, quality=92)
        images.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
        for label, (x0, y0, x1, y1) in shapes:
            annotations.append({"id": len(annotations), "image_id": image_id, "category_id": label + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                                "iscrowd": 0, "segmentation": []})
    categories = [{"id": 0, "name": PARENT, "supercategory": "none"}]
    categories += [{"id": i + 1, "name": name, "supercategory": PARENT} for i, name in enumerate(classes)]
    data = {"info": {"description": "detrkit synthetic shapes"}, "images": images,
            "annotations": annotations, "categories": categories}
    (folder / ROBOFLOW_ANNOTATIONS).write_text(json.dumps(data, indent=1))


def class_colour(label: int, num_classes: int, rng: np.random.Generator | None = None) -> tuple[int, int, int]:
    """The class's hue at full saturation, jittered a little in hue and brightness by `rng`."""
    hue, value = label / num_classes, 0.9
    if rng is not None:
        hue, value = hue + rng.uniform(-0.03, 0.03), value + rng.uniform(-0.15, 0.1)
    red, green, blue = colorsys.hsv_to_rgb(hue % 1.0, 0.9, value)
    return round(red * 255), round(green * 255), round(blue * 255)


def _draw_image(size: tuple[int, int], num_classes: int, objects: tuple[int, int],
                rng: np.random.Generator) -> tuple[Image.Image, list[tuple[int, tuple[int, int, int, int]]]]:
    image = Image.fromarray(_background(size, rng))
    draw = ImageDraw.Draw(image)
    shapes: list[tuple[int, tuple[int, int, int, int]]] = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        box = _place(size, [box for _, box in shapes], rng)
        if box is None:
            continue
        label = int(rng.integers(num_classes))
        _draw_shape(draw, SHAPES[label % len(SHAPES)], box, class_colour(label, num_classes, rng))
        shapes.append((label, box))
    return image, shapes


def _background(size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """(H, W, 3) uint8: a greyish tilted gradient, pixel noise and a few faint lines."""
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width] / max(width, height)
    base = rng.uniform(70, 190) + rng.uniform(-20, 20, 3)
    tilt = rng.uniform(-50, 50, (2, 3))
    pixels = base + xs[..., None] * tilt[0] + ys[..., None] * tilt[1] + rng.normal(0, 10, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 8))):
        ends = [int(v) for v in rng.integers(0, [width, height, width, height])]
        draw.line(ends, fill=tuple(int(v) for v in rng.integers(60, 200, 3)), width=int(rng.integers(1, 4)))
    return np.asarray(image)


def _place(size: tuple[int, int], taken: list[tuple[int, int, int, int]],
           rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """A square box (x0, y0, x1, y1), exclusive ends, overlapping no earlier box by IoU > 0.1."""
    width, height = size
    for _ in range(20):
        side = int(rng.uniform(*SIDE_RANGE) * min(width, height))
        x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        box = (x0, y0, x0 + side, y0 + side)
        if all(_iou(box, other) <= 0.1 for other in taken):
            return box
    return None


def _iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int],
                colour: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box[0], box[1], box[2] - 1, box[3] - 1  # PIL's ends are inclusive
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif shape == "square":
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    elif shape == "triangle":
        draw.polygon([(x0, y1), (x1, y1), (cx, y0)], fill=colour)
    else:
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=colour)
