"""Pictures for people: detections and ground truth drawn on images, and a generated sample image."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

if TYPE_CHECKING:
    import supervision as sv

_PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
            (145, 30, 180), (70, 240, 240), (240, 50, 230)]


def draw_detections(image: Image.Image, detections: sv.Detections) -> Image.Image:
    """A copy of `image` with one solid box per detection and a label chip ("name 0.87") that stays
    readable on any background: filled in the box's colour, text black or white by its brightness.
    Chips that would overlap (duplicate boxes) are stacked, the highest score first."""
    canvas = image.convert("RGB").copy()
    draw = ImageDraw.Draw(canvas)
    font = _font(canvas)
    names = detections.data.get("class_name", [str(c) for c in detections.class_id])
    rows = sorted(zip(detections.xyxy, detections.confidence, detections.class_id, names), key=lambda row: -row[1])
    for box, _, class_id, _ in rows:
        draw.rectangle([float(v) for v in box], outline=_PALETTE[int(class_id) % len(_PALETTE)], width=2)
    placed: list[tuple[float, float, float, float]] = []
    for box, score, class_id, name in rows:
        placed.append(_label(draw, (float(box[0]), float(box[1])), f"{name} {score:.2f}",
                             _PALETTE[int(class_id) % len(_PALETTE)], font, placed))
    return canvas


def draw_ground_truth(image: Image.Image, boxes: np.ndarray) -> Image.Image:
    """A copy of `image` with each ground-truth box (N, 4) xyxy pixels dashed white over black, a style
    no prediction uses and visible on light and dark backgrounds alike."""
    canvas = image.convert("RGB").copy()
    draw = ImageDraw.Draw(canvas)
    for x0, y0, x1, y1 in np.asarray(boxes, dtype=float).reshape(-1, 4):
        corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]
        draw.line(corners, fill=(0, 0, 0), width=3)
        for start, end in itertools.pairwise(corners):
            _dashes(draw, start, end, (255, 255, 255))
    return canvas


def caption(image: Image.Image, text: str) -> Image.Image:
    """`image` above a white strip holding `text` in black."""
    font = _font(image)
    height = int(font.size * 1.6) if hasattr(font, "size") else 14
    sheet = Image.new("RGB", (image.width, image.height + height), "white")
    sheet.paste(image, (0, 0))
    ImageDraw.Draw(sheet).text((4, image.height + height // 6), text, fill=(0, 0, 0), font=font)
    return sheet


def _font(image: Image.Image):
    return ImageFont.load_default(size=max(10, min(image.size) // 22))


def _label(draw: ImageDraw.ImageDraw, corner: tuple[float, float], text: str, colour: tuple[int, int, int],
           font, placed: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    """A filled chip with `text` above the box corner (inside the box when the box touches the image's
    top), moved down past the chips already `placed`; returns its rectangle."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    width, height = right - left + 4, bottom - top + 4
    x = max(0.0, corner[0])  # at the box's left edge, clipped at the image's right edge
    y = corner[1] - height if corner[1] - height >= 0 else corner[1]
    while any(x < r[2] and r[0] < x + width and y < r[3] and r[1] < y + height for r in placed):
        y += height
    draw.rectangle([x, y, x + width, y + height], fill=colour)
    brightness = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2]
    draw.text((x + 2 - left, y + 2 - top), text, fill=(0, 0, 0) if brightness > 140 else (255, 255, 255), font=font)
    return x, y, x + width, y + height


def _dashes(draw: ImageDraw.ImageDraw, start: tuple[float, float], end: tuple[float, float],
            colour: tuple[int, int, int], dash: float = 4.0) -> None:
    length = float(np.hypot(end[0] - start[0], end[1] - start[1]))
    for offset in np.arange(0.0, length, 2 * dash):
        a, b = offset / max(length, 1e-6), min(offset + dash, length) / max(length, 1e-6)
        draw.line([(start[0] + a * (end[0] - start[0]), start[1] + a * (end[1] - start[1])),
                   (start[0] + b * (end[0] - start[0]), start[1] + b * (end[1] - start[1]))], fill=colour, width=1)


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
