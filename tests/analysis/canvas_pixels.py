"""Render a matplotlib axis that fills its figure and read colours back at image pixel coordinates."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb

from detrkit.analysis.drawing import MASK_ALPHA

SCALE = 4  # rendered pixels per image pixel


def canvas(height: int, width: int):
    """A figure whose one axis fills it, SCALE rendered pixels to an image pixel."""
    figure = plt.figure(figsize=(width * SCALE / 100, height * SCALE / 100), dpi=100)
    return figure, figure.add_axes((0, 0, 1, 1))


def rendered(figure) -> np.ndarray:
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(float) / 255
    plt.close(figure)
    return pixels


def pixel(pixels: np.ndarray, x: float, y: float) -> np.ndarray:
    """The rendered colour at image pixel coordinates (x, y)."""
    return pixels[int(y * SCALE), int(x * SCALE)]


def tinted(colour: str) -> np.ndarray:
    return MASK_ALPHA * np.array(to_rgb(colour))  # over black
