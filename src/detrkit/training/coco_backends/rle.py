"""Binary masks to COCO's uncompressed run-length encoding, batched in torch.

COCO reads a mask column by column (Fortran order) and starts with a run of zeros, so a mask
whose first pixel is set begins with a zero-length run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EncodedMasks:
    """N masks of one (H, W) size, run-length encoded (see encode_masks): what the metric stores,
    so that an epoch of masks can be kept on the device at a fraction of their dense size."""

    runs: torch.Tensor  # (R,) int64, every mask's runs concatenated
    lengths: torch.Tensor  # (N,) int64, runs per mask
    size: tuple[int, int]  # (H, W)

    @classmethod
    def encode(cls, masks: torch.Tensor, windows: torch.Tensor | None = None) -> EncodedMasks:
        """From (N, H, W) bool masks; with (N, 4) `windows` (see encode_masks_in_windows), reading
        only those."""
        runs = encode_masks(masks) if windows is None else encode_masks_in_windows(masks, windows)
        return cls(*runs, tuple(masks.shape[-2:]))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.lengths), *self.size)

    @property
    def ndim(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self.lengths)

    def detach(self) -> EncodedMasks:
        return self

    def cpu(self) -> EncodedMasks:
        return EncodedMasks(self.runs.cpu(), self.lengths.cpu(), self.size)


def encode_masks(masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run lengths of N (H, W) masks: (all runs concatenated (R,), runs per mask (N,)), int64.

    Stays on the masks' device; the nonzero() it needs synchronises a GPU once per call.
    """
    num, height, width = masks.shape
    pixels = height * width
    columns = masks.bool().transpose(1, 2).reshape(num, pixels)  # (N, W*H), column-major
    # a leading 0 (the first run is of zeros) and a trailing value unlike the last pixel, so that
    # every run, the last one included, ends where the value changes; nonzero() lists those ends
    # in order, by mask and then by pixel
    padded = torch.cat([columns.new_zeros(num, 1), columns, ~columns[:, -1:]], dim=1)  # (N, W*H + 2)
    mask_index, position = (padded[:, 1:] != padded[:, :-1]).nonzero().unbind(1)
    first = torch.ones_like(mask_index, dtype=torch.bool)
    first[1:] = mask_index[1:] != mask_index[:-1]
    previous = torch.roll(position, 1)
    runs = position - torch.where(first, torch.zeros_like(previous), previous)
    return runs, torch.bincount(mask_index, minlength=num)


def encode_masks_in_windows(masks: torch.Tensor, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """encode_masks for (N, H, W) masks that are False outside their (N, 4) [y0, y1, x0, x1)
    windows: only the windows are read, so the cost follows their area, not the image's.

    Each window is read column by column between rows of zeros, so every run of ones starts and
    ends inside it; an end and a start at the same pixel (a run that wraps from one column into
    the next of a full-height window) cancel.
    """
    height, width = masks.shape[-2:]
    pixels = height * width
    runs, lengths = [], []
    for mask, (y0, y1, x0, x1) in zip(masks, windows.tolist()):
        edges = masks.new_zeros(0, dtype=torch.long)
        if y1 > y0 and x1 > x0:
            columns = torch.zeros((x1 - x0, y1 - y0 + 2), dtype=torch.bool, device=masks.device)
            columns[:, 1:-1] = mask[y0:y1, x0:x1].t()
            column, row = (columns[:, 1:] != columns[:, :-1]).nonzero().unbind(1)
            edges = (x0 + column) * height + y0 + row  # starts and ends of the runs of ones, in order
            kept = torch.ones_like(edges, dtype=torch.bool)
            touching = (edges[1:] == edges[:-1]).nonzero().flatten()
            kept[touching], kept[touching + 1] = False, False
            edges = edges[kept]
        bounds = [edges.new_zeros(1), edges]
        if not len(edges) or int(edges[-1]) != pixels:  # a last run of zeros, unless the mask ends set
            bounds.append(edges.new_full((1,), pixels))
        counts = torch.diff(torch.cat(bounds))
        runs.append(counts)
        lengths.append(len(counts))
    if not runs:
        return masks.new_zeros(0, dtype=torch.long), masks.new_zeros(0, dtype=torch.long)
    return torch.cat(runs), torch.tensor(lengths, dtype=torch.long, device=masks.device)


def split_runs(runs: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Per-mask uint32 run arrays from the concatenated encoding."""
    runs = runs.astype(np.uint32)
    ends = np.cumsum(lengths).tolist()
    return [runs[start:end] for start, end in zip([0] + ends[:-1], ends)]


def mask_areas(runs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(N,) float64 pixel counts: the sums of each mask's odd (foreground) runs."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    foreground = (np.arange(len(runs)) - starts) % 2 == 1
    owner = np.repeat(np.arange(len(lengths)), lengths)
    return np.bincount(owner[foreground], weights=runs[foreground], minlength=len(lengths)).astype(np.float64)


def decode_runs(runs: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W) bool mask of one run-length array; the inverse of encode_masks, for tests."""
    values = np.arange(len(runs)) % 2 == 1
    return np.repeat(values, runs).reshape(width, height).T
