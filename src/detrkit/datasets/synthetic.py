"""Write a small Roboflow-COCO data set of coloured shapes on noisy backgrounds (the demo data).

Each shape is a polygon, written as its annotation's COCO `segmentation` and painted on exactly
the pixels COCO's rasteriser gives it, so the masks are exact (the circle is a 48-gon). For a pose
demo each shape can also carry the four corner pixels of its box as COCO keypoints, named with
left and right sides so that the flip pairs follow from the names.
"""

from __future__ import annotations

import colorsys
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from detrkit.datasets.coco import ROBOFLOW_ANNOTATIONS
from detrkit.datasets.segments import rasterise

SHAPES = ("circle", "square", "triangle", "diamond")  # class i is drawn as SHAPES[i % 4]
SIDE_RANGE = (0.10, 0.30)  # object side as a fraction of the image's shorter side
PARENT = "shapes"  # Roboflow-style root category, dropped by the reader
CIRCLE_VERTICES = 48
CORNERS = ("top_left", "top_right", "bottom_right", "bottom_left")  # keypoint names, in order
CORNER_SKELETON = [[1, 2], [2, 3], [3, 4], [4, 1]]  # COCO skeletons count keypoints from 1


def make_synthetic_dataset(root: str | os.PathLike, num_train: int = 48, num_valid: int = 16, num_test: int = 0,
                           image_size: tuple[int, int] = (320, 240),
                           classes: Sequence[str] = ("circle", "square", "triangle"),
                           min_objects: int = 1, max_objects: int = 6, seed: int = 0,
                           keypoints: bool = False) -> Path:
    """Write `root/{train,valid[,test]}` (JPEGs + _annotations.coco.json); image_size is (W, H).
    Class i has its own hue and shape; the same arguments always write the same files. With
    `keypoints`, every shape has the four CORNERS of its box as visible COCO keypoints."""
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
        _write_split(root / split, count, (width, height), list(classes), (min_objects, max_objects), rng,
                     keypoints)
    return root


def _write_split(folder: Path, count: int, size: tuple[int, int], classes: list[str],
                 objects: tuple[int, int], rng: np.random.Generator, keypoints: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for image_id in range(count):
        image, shapes = _draw_image(size, len(classes), objects, rng)
        name = f"shapes_{image_id:05d}.jpg"
        image.save(folder / name, quality=92)
        images.append({"id": image_id, "file_name": name, "width": size[0], "height": size[1]})
        for label, (x0, y0, x1, y1), polygon, area in shapes:
            annotations.append({"id": len(annotations), "image_id": image_id, "category_id": label + 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": area, "iscrowd": 0,
                                "segmentation": [polygon]})
            if keypoints:
                annotations[-1].update(keypoints=corner_keypoints((x0, y0, x1, y1)), num_keypoints=len(CORNERS))
    categories = [{"id": 0, "name": PARENT, "supercategory": "none"}]
    categories += [{"id": i + 1, "name": name, "supercategory": PARENT} for i, name in enumerate(classes)]
    for category in categories[1:] if keypoints else []:
        category.update(keypoints=list(CORNERS), skeleton=CORNER_SKELETON)
    data = {"info": {"description": "detrkit synthetic shapes"}, "images": images,
            "annotations": annotations, "categories": categories}
    (folder / ROBOFLOW_ANNOTATIONS).write_text(json.dumps(data, indent=1))


def corner_keypoints(box: tuple[int, int, int, int]) -> list[int]:
    """COCO keypoints [x, y, v] * 4 of the corner pixels of a box (x0, y0, x1, y1), exclusive
    ends, in CORNERS order, all visible; pixel i is centred on i (so the right column is x1 - 1)."""
    x0, y0, x1, y1 = box
    points = ((x0, y0), (x1 - 1, y0), (x1 - 1, y1 - 1), (x0, y1 - 1))
    return [value for x, y in points for value in (x, y, 2)]


def class_colour(label: int, num_classes: int, rng: np.random.Generator | None = None) -> tuple[int, int, int]:
    """The class's hue at full saturation, jittered a little in hue and brightness by `rng`."""
    hue, value = label / num_classes, 0.9
    if rng is not None:
        hue, value = hue + rng.uniform(-0.03, 0.03), value + rng.uniform(-0.15, 0.1)
    red, green, blue = colorsys.hsv_to_rgb(hue % 1.0, 0.9, value)
    return round(red * 255), round(green * 255), round(blue * 255)


Shape = tuple[int, tuple[int, int, int, int], list[float], int]  # label, box of the mask, polygon, area


def _draw_image(size: tuple[int, int], num_classes: int, objects: tuple[int, int],
                rng: np.random.Generator) -> tuple[Image.Image, list[Shape]]:
    pixels = _background(size, rng).copy()
    shapes: list[Shape] = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        box = _place(size, [shape[1] for shape in shapes], rng)
        if box is None:
            continue
        label = int(rng.integers(num_classes))
        polygon = shape_polygon(SHAPES[label % len(SHAPES)], box)
        mask = rasterise([np.array(polygon).reshape(-1, 2)], (size[1], size[0]))  # (H, W)
        pixels[mask] = class_colour(label, num_classes, rng)
        ys, xs = np.nonzero(mask)  # the box hugs the painted pixels (a tip may not fill its pixel)
        tight = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        shapes.append((label, tight, polygon, int(mask.sum())))
    return Image.fromarray(pixels), shapes


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
    """A square box (x0, y0, x1, y1), exclusive ends, overlapping no earlier shape's box (so every
    mask is all of its shape's pixels)."""
    width, height = size
    for _ in range(20):
        side = int(rng.uniform(*SIDE_RANGE) * min(width, height))
        x0, y0 = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        box = (x0, y0, x0 + side, y0 + side)
        if all(_iou(box, other) == 0 for other in taken):
            return box
    return None


def _iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def shape_polygon(shape: str, box: tuple[int, int, int, int]) -> list[float]:
    """COCO polygon [x1, y1, ..., xn, yn] of a shape filling the box (x0, y0, x1, y1), exclusive
    ends, in COCO's continuous coordinates (pixel x covers [x, x + 1)), so its bounds are the box."""
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "circle":
        turns = np.arange(CIRCLE_VERTICES) * (2 * np.pi / CIRCLE_VERTICES)
        points = np.stack([cx + (x1 - x0) / 2 * np.cos(turns), cy + (y1 - y0) / 2 * np.sin(turns)], 1)
    elif shape == "square":
        points = np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
    elif shape == "triangle":
        points = np.array([(x0, y1), (x1, y1), (cx, y0)])
    else:
        points = np.array([(cx, y0), (x1, cy), (cx, y1), (x0, cy)])
    return [round(float(v), 2) for v in points.ravel()]


def synthetic_images(count: int, size: tuple[int, int] = (640, 480), num_classes: int = 3,
                     seed: int = 0) -> list[Image.Image]:
    """`count` demo-style images of (width, height) `size`, the same for the same arguments (in memory)."""
    rng = np.random.default_rng([seed, 41])
    return [_draw_image(size, num_classes, (2, 6), rng)[0] for _ in range(count)]
