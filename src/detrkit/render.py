"""Pictures for people: detections drawn on images, and a generated sample image."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

if TYPE_CHECKING:
    import supervision as sv

_PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
            (145, 30, 180), (70, 240, 240), (240, 50, 230)]


def draw_detections(image: Image.Image, detections: sv.Detections) -> Image.Image:
    """A copy of `image` with one labelled box per detection."""
    canvas = image.convert("RGB").copy()
    draw = ImageDraw.Draw(canvas)
    names = detections.data.get("class_name", [str(c) for c in detections.class_id])
    for box, score, class_id, name in zip(detections.xyxy, detections.confidence, detections.class_id, names):
        colour = _PALETTE[int(class_id) % len(_PALETTE)]
        draw.rectangle([float(v) for v in box], outline=colour, width=2)
        draw.text((float(box[0]) + 3, float(box[1]) + 2), f"{name} {score:.2f}", fill=colour)
    return canvas


def sample_image(width: int = 640, height: int = 480, seed: int = 0) -> Image.Image:
    """Coloured rectangles and ellipses on a noisy background."""
    rng = np.random.default_rng(seed)
    background = rng.integers(90, 160, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(background)
    draw = ImageDraw.Draw(image)
    for index in range(6):
        w, h = rng.integers(40, 160, size=2)
        x, y = rng.integers(0, width - w), rng.integers(0, height - h)
        shape = draw.rectangle if index % 2 else draw.ellipse
        shape([int(x), int(y), int(x + w), int(y + h)], fill=_PALETTE[index % len(_PALETTE)])
    return image
