"""The OKS sigmas a keypoint evaluation uses: the given ones, COCO person's for 17 keypoints, else 0.05 each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# COCO person keypoints (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles),
# as pycocotools' keypoint Params define them
COCO_PERSON_SIGMAS = tuple((np.array([.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87,
                                      .89, .89]) / 10.0).tolist())
DEFAULT_SIGMA = 0.05  # per keypoint of any other schema (spec 9)


def check_sigmas(sigmas: Sequence[float] | None) -> tuple[float, ...] | None:
    """Given sigmas as floats; a non-empty list of positive finite numbers, or None."""
    if sigmas is None:
        return None
    values = np.asarray(list(sigmas), dtype=np.float64)
    if values.ndim != 1 or not values.size or not np.isfinite(values).all() or (values <= 0).any():
        raise ValueError(f"keypoint OKS sigmas must be a non-empty list of positive finite numbers, got {sigmas!r}")
    return tuple(values.tolist())


def oks_sigmas(count: int, given: tuple[float, ...] | None) -> np.ndarray:
    """(count,) float64 sigmas for keypoints of `count` per instance."""
    if given is not None:
        if len(given) != count:
            raise ValueError(f"{len(given)} keypoint OKS sigmas given for {count} keypoints per instance")
        return np.asarray(given, dtype=np.float64)
    if count == len(COCO_PERSON_SIGMAS):
        return np.asarray(COCO_PERSON_SIGMAS, dtype=np.float64)
    return np.full(count, DEFAULT_SIGMA, dtype=np.float64)
