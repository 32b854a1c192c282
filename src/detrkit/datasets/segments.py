"""Instance masks kept compact: segmentations are checked and stored as compressed COCO RLE when a
data set is read, and decoded to (N, H, W) bool tensors only for the sample being built.

Polygons use COCO's continuous pixel coordinates: pixel (x, y) covers [x, x + 1) x [y, y + 1).
pycocotools (the `train` extra) does the rasterising, encoding and decoding; it is imported only
when masks are asked for, so detection data pays nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

BORDER_SLACK = 1.0  # polygon vertices may lie this many pixels outside the image (rounding)
_RLE_ZERO = 48  # compressed counts: each character is 48 + a 6-bit group


def coco_mask_api():
    """pycocotools.mask, or an ImportError that says how to install it."""
    try:
        from pycocotools import mask
    except ImportError as error:
        raise ImportError("instance masks need pycocotools: pip install 'detrkit[train]'") from error
    return mask


def encode_segmentation(segmentation: object, size: tuple[int, int], where: str) -> bytes:
    """Compressed RLE counts of one COCO `segmentation` at image size (H, W): polygons (a list of
    [x1, y1, ..., xn, yn] parts, OR-ed), RLE with str/bytes (compressed) or list (uncompressed)
    counts, or None / [] for no mask (all zero). Errors start with `where` (file and annotation)."""
    if segmentation is None or (isinstance(segmentation, list) and not segmentation):
        return empty_counts(size)
    if isinstance(segmentation, dict):
        return _encode_rle(segmentation, size, where)
    if isinstance(segmentation, list) and all(isinstance(part, list) for part in segmentation):
        parts = []
        for index, part in enumerate(segmentation):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in part) or len(part) % 2:
                raise ValueError(f"{where}: segmentation polygon {index} must be an even-length list of numbers "
                                 f"[x1, y1, ..., xn, yn], got {_short(part)}")
            parts.append(np.asarray(part, dtype=np.float64).reshape(-1, 2))
        return encode_polygons(parts, size, where)
    raise ValueError(f"{where}: segmentation must be a list of polygons [[x1, y1, ...], ...] or an RLE "
                     f"{{'size': [H, W], 'counts': ...}}, got {_short(segmentation)}")


def encode_polygons(parts: Sequence[np.ndarray], size: tuple[int, int], where: str) -> bytes:
    """Compressed RLE counts of the union of polygons, each (n, 2) x, y in pixels. A part with
    fewer than 3 points, or a vertex more than BORDER_SLACK pixels outside the image, is an error."""
    height, width = size
    for index, points in enumerate(parts):
        if len(points) < 3:
            raise ValueError(f"{where}: polygon {index} has {len(points)} point(s); a polygon needs at least 3")
        if not np.isfinite(points).all():
            raise ValueError(f"{where}: polygon {index} has a non-finite coordinate")
        low, high = points.min(axis=0), points.max(axis=0)
        if (low < -BORDER_SLACK).any() or high[0] > width + BORDER_SLACK or high[1] > height + BORDER_SLACK:
            raise ValueError(f"{where}: polygon {index} spans x {low[0]:g}..{high[0]:g}, y {low[1]:g}..{high[1]:g}, "
                             f"outside the {width}x{height} image by more than {BORDER_SLACK:g} pixel")
    api = coco_mask_api()
    # pycocotools reads a first part of exactly 4 numbers as a box; every part here has >= 6
    rles = api.frPyObjects([points.ravel().tolist() for points in parts], height, width)
    return api.merge(rles)["counts"]


def _encode_rle(rle: dict, size: tuple[int, int], where: str) -> bytes:
    counts, declared = rle.get("counts"), rle.get("size")
    if list(declared or ()) != list(size):
        raise ValueError(f"{where}: RLE size {declared!r} disagrees with the image size [H, W] = {list(size)}")
    total = size[0] * size[1]
    if isinstance(counts, (str, bytes)):
        counts = counts.encode("ascii") if isinstance(counts, str) else counts
        found = compressed_total(counts, where)
        if found != total:
            raise ValueError(f"{where}: compressed RLE counts cover {found} pixels; the image has {total}")
        return counts
    if isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        if sum(counts) != total:
            raise ValueError(f"{where}: RLE counts cover {sum(counts)} pixels; the image has {total}")
        return coco_mask_api().frPyObjects({"size": list(size), "counts": counts}, *size)["counts"]
    raise ValueError(f"{where}: RLE counts must be a string (compressed) or a list of non-negative integers, "
                     f"got {_short(counts)}")


def compressed_total(counts: bytes, where: str) -> int:
    """The pixels a compressed RLE string covers (the sum of its runs), checking every run. The
    format: each run is a little-endian series of 5-bit groups in characters 48 + group, bit 5
    saying another group follows and bit 4 of the last group its sign; from the third run on a
    run is stored as its difference to the run two before."""
    runs: list[int] = []
    position = 0
    while position < len(counts):
        value, shift, more = 0, 0, True
        while more:
            if position == len(counts):
                raise ValueError(f"{where}: compressed RLE counts end in the middle of a run")
            group = counts[position] - _RLE_ZERO
            if not 0 <= group < 64:
                raise ValueError(f"{where}: compressed RLE counts hold the invalid character {chr(counts[position])!r}")
            value |= (group & 0x1F) << shift
            more, position, shift = bool(group & 0x20), position + 1, shift + 5
        if group & 0x10:
            value -= 1 << shift  # sign-extend
        value += runs[-2] if len(runs) > 2 else 0
        if value < 0:
            raise ValueError(f"{where}: compressed RLE counts hold a negative run ({value})")
        runs.append(value)
    return sum(runs)


def empty_counts(size: tuple[int, int]) -> bytes:
    """Compressed RLE counts of an all-zero mask."""
    return coco_mask_api().frPyObjects({"size": list(size), "counts": [size[0] * size[1]]}, *size)["counts"]


def mask_areas(counts: Sequence[bytes], size: tuple[int, int]) -> np.ndarray:
    """(N,) pixels set in each mask, without decoding them."""
    if not counts:
        return np.zeros(0, dtype=np.int64)
    return coco_mask_api().area([{"size": list(size), "counts": c} for c in counts]).astype(np.int64)


def decode_masks(counts: Sequence[bytes], size: tuple[int, int]) -> torch.Tensor:
    """(N, H, W) bool masks from compressed RLE counts at size (H, W)."""
    if not counts:
        return torch.zeros((0, *size), dtype=torch.bool)
    with warnings.catch_warnings():  # pycocotools' own NumPy 2 deprecation notice, on every call
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        stack = coco_mask_api().decode([{"size": list(size), "counts": c} for c in counts])  # (H, W, N) uint8
    return torch.from_numpy(np.ascontiguousarray(stack.transpose(2, 0, 1))).bool()


def rasterise(parts: Sequence[np.ndarray], size: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: the pixels the union of polygons (each (n, 2) x, y) covers, as COCO reads them."""
    return decode_masks([encode_polygons(parts, size, "polygon")], size)[0].numpy()


def warn_empty(empty: int, total: int, where: str) -> None:
    """One warning for all the boxes of a file whose mask covers no pixel."""
    if empty:
        warnings.warn(f"{empty} of {total} boxes in {where} have an empty mask (no segmentation, or one that "
                      f"covers no pixel); they train with all-zero masks", stacklevel=3)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
