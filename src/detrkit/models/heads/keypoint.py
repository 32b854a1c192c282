"""Keypoint head: 8-channel keypoint slots decoded against each query's box, laid out per class.

Slot channels: x, y (normalised image coordinates), findable logit (v > 0), visible logit
(v == 2), log l11, l21, log l22 (Cholesky factor of the location precision), and the
keypoint's contribution to its class logit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from detrkit.models.mlp import MLP

KEYPOINT_CHANNELS = 8
PRECISION_CHANNELS = slice(4, 7)  # log l11, l21, log l22
CLASS_CHANNEL = 7


def active_keypoint_mask(schema: Sequence[int]) -> torch.Tensor:
    """(classes, max keypoints) bool: True on the slots a class uses; (0, 0) for an empty schema."""
    if not schema:
        return torch.zeros(0, 0, dtype=torch.bool)
    return torch.arange(max(schema))[None] < torch.tensor(list(schema))[:, None]


class KeypointHead(MLP):
    """3-layer MLP from keypoint states to slot deltas; zero last layer, so keypoints start at
    their box centres. `schema` lists the keypoints of each keypoint class, which own the
    class-logit indices 0, 1, ... in that order."""

    def __init__(self, dim: int, schema: Sequence[int]) -> None:
        super().__init__(dim, dim, KEYPOINT_CHANNELS, 3)
        nn.init.zeros_(self.layers[-1].weight)
        nn.init.zeros_(self.layers[-1].bias)
        self.schema = tuple(schema)
        width = max(self.schema)
        # compact keypoint j -> its slot in the class-padded layout (class c owns slots c*width...)
        slots = [c * width + i for c, count in enumerate(self.schema) for i in range(count)]
        self.padded_count = len(self.schema) * width
        self.register_buffer("_slots", torch.tensor(slots), persistent=False)

    def predict(self, states: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """states (..., Q, K, Dk) compact keypoint states; boxes (..., Q, 4) cxcywh the offsets
        scale with. Returns (..., Q, classes * max keypoints, 8), unused slots zero."""
        delta = torch.nan_to_num(self(states), nan=0.0, posinf=0.0, neginf=0.0)
        xy = delta[..., :2] * boxes[..., None, 2:] + boxes[..., None, :2]
        keypoints = torch.cat((xy, delta[..., 2:]), -1)
        if keypoints.shape[-2] == self.padded_count:
            return keypoints
        padded = keypoints.new_zeros(*keypoints.shape[:-2], self.padded_count, KEYPOINT_CHANNELS)
        return padded.index_copy(-2, self._slots, keypoints)


def keypoint_class_logits(keypoints: torch.Tensor, active: torch.Tensor, num_logits: int) -> torch.Tensor:
    """(..., num_logits) logit offsets: class c gains the sum of the class channel over its
    active keypoints; logits past the keypoint classes gain 0.

    keypoints (..., classes * max keypoints, 8) class-padded; active (classes, max keypoints)."""
    contributions = keypoints[..., CLASS_CHANNEL].unflatten(-1, active.shape) * active.to(keypoints.dtype)
    boost = contributions.sum(-1)  # (..., classes)
    return F.pad(boost, (0, num_logits - boost.shape[-1]))


def reset_precision_rows(head: MLP) -> None:
    """Zero the weights and biases of the precision outputs, so every keypoint starts at unit
    precision (log l11 = log l22 = 0, l21 = 0)."""
    last = head.layers[-1]
    with torch.no_grad():
        last.weight[PRECISION_CHANNELS].zero_()
        last.bias[PRECISION_CHANNELS].zero_()
