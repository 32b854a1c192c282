"""Matplotlib marks the galleries share: an image in pixel coordinates, labelled boxes, mask overlays, keypoints."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle

CLASS_COLOURS = [matplotlib.colors.to_hex(colour) for colour in plt.get_cmap("tab10").colors]
MASK_ALPHA = 0.45
LABEL_ROOM = 0.07  # of the image's height: a label needs about this much above (below) its box
MAX_DRAWN_SIDE = 400  # pixels; images and masks larger are subsampled before drawing
Edges = Sequence[tuple[int, int]]  # skeleton edges between keypoint slots, 0-based


def class_colour(label: int) -> str:
    return CLASS_COLOURS[label % len(CLASS_COLOURS)]


def class_name(class_names: Sequence[str], label: int) -> str:
    return class_names[label] if 0 <= label < len(class_names) else f"class {label}"


def show_image(axis, image: np.ndarray, size: tuple[int, int] | None = None) -> None:
    """(h, w, 3) uint8 stretched over an image of `size` (H, W; default its own), pixel (0, 0)
    spanning [0, 1) x [0, 1): box and keypoint pixels of that image land as given."""
    height, width = size or image.shape[:2]
    axis.imshow(image, extent=(0, width, height, 0), interpolation="nearest")
    axis.set_axis_off()


def drawing_step(size: tuple[int, int]) -> int:
    """The stride that brings an image of `size` to at most MAX_DRAWN_SIDE pixels a side: finer
    than a gallery cell shows, and it keeps the rasterising and mask outlines cheap."""
    return max(1, math.ceil(max(size) / MAX_DRAWN_SIDE))


def draw_box(axis, box: Sequence[float], colour: str, text: str, dashed: bool = False) -> None:
    """An xyxy box with its label above it (dashed boxes: below, clear of a solid box's label);
    inside the box where that would leave the image."""
    x0, y0, x1, y1 = box
    axis.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linewidth=1.8,
                             linestyle="--" if dashed else "-"))
    bottom, top = axis.get_ylim()  # image rows grow downwards: (H, 0)
    edge = LABEL_ROOM * (bottom - top)
    y, below = (y1, True) if dashed else (y0, False)
    if (below and y > bottom - edge) or (not below and y < top + edge):
        below = not below
    axis.text(x0, y, text, fontsize=7, color="white", va="top" if below else "bottom",
              bbox={"facecolor": colour, "edgecolor": "none", "pad": 1, "alpha": 0.85}, clip_on=True)


def overlay_masks(axis, masks: np.ndarray, colours: Sequence[str], size: tuple[int, int]) -> None:
    """(N, h, w) bool masks tinted in their colours (MASK_ALPHA) and outlined, stretched over an
    image of `size` (H, W); pixels outside every mask stay untouched (alpha 0). Later masks lie on top."""
    if not len(masks):
        return
    step = drawing_step(masks.shape[1:])
    masks = masks[:, ::step, ::step]  # (N, h / step, w / step)
    overlay = np.zeros((*masks.shape[1:], 4))  # (h, w, RGBA)
    for mask, colour in zip(masks, colours, strict=True):
        overlay[mask] = (*to_rgb(colour), MASK_ALPHA)
    axis.imshow(overlay, extent=(0, size[1], size[0], 0), interpolation="nearest")
    # the outline at the mask pixels' centres: visible where the tint is close to the object's colour
    columns = (np.arange(masks.shape[2]) + 0.5) * size[1] / masks.shape[2]
    rows = (np.arange(masks.shape[1]) + 0.5) * size[0] / masks.shape[1]
    for mask, colour in zip(masks, colours):
        if mask.any() and not mask.all():
            axis.contour(columns, rows, mask.astype(np.float32), levels=[0.5], colors=[colour], linewidths=1.0)


def draw_keypoints(axis, points: np.ndarray, shown: np.ndarray, hollow: np.ndarray, edges: Edges,
                   colour: str) -> None:
    """One instance's keypoints (K, 2) pixels: the `shown` ones as dots (`hollow` rings, for
    occluded ones), and the skeleton's edges between two shown keypoints."""
    lines = [(points[a], points[b]) for a, b in edges
             if 0 <= a < len(points) and 0 <= b < len(points) and shown[a] and shown[b]]
    if lines:
        axis.add_collection(LineCollection(lines, colors=colour, linewidths=1.2, alpha=0.9, zorder=3))
    solid, ring = shown & ~hollow, shown & hollow
    axis.scatter(points[solid, 0], points[solid, 1], s=14, c=colour, edgecolors="white", linewidths=0.6, zorder=4)
    axis.scatter(points[ring, 0], points[ring, 1], s=14, facecolors="none", edgecolors=colour, linewidths=1.2,
                 zorder=4)
