"""Box-count normalisation of gradients accumulated by hand over micro-batches (spec 7.7).

Keypoint models accumulate manually: each micro-batch's loss numerator (the criterion with
num_boxes = 1) is divided by the boxes counted so far in the window, and the gradients already
accumulated are first rescaled by old / new count. After k micro-batches the gradient is that of
Σ numerators / Σ counts, as if the k micro-batches were one batch. Counts stay tensors, so
nothing here waits for the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class AccumulationScales:
    """Before a micro-batch's backward: divide its loss numerator by `denominator`, the running
    box count, and multiply the gradients accumulated earlier in the window by `gradients`,
    old / new running count (None when the window starts)."""

    denominator: torch.Tensor
    gradients: torch.Tensor | None


def accumulation_scales(running: torch.Tensor | None,
                        count: torch.Tensor) -> tuple[torch.Tensor, AccumulationScales]:
    """Running box count before this micro-batch (None at the window's start) and this
    micro-batch's count -> the new running count and this micro-batch's scales."""
    count = count.detach()
    total = count if running is None else running + count
    return total, AccumulationScales(total, None if running is None else running / total)


class BoxCountNormaliser:
    """The running box count of one accumulation window; `reset` after each optimizer step."""

    def __init__(self) -> None:
        self.running: torch.Tensor | None = None

    def scales(self, count: torch.Tensor) -> AccumulationScales:
        """Add this micro-batch's box count (the criterion's normaliser) and return its scales."""
        self.running, scales = accumulation_scales(self.running, count)
        return scales

    def reset(self) -> None:
        self.running = None


def rescale_gradients(parameters: Iterable[torch.nn.Parameter], scale: torch.Tensor | None) -> None:
    """Multiply every existing gradient by `scale` in place; None leaves them as they are."""
    if scale is None:
        return
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.grad.mul_(scale.to(device=parameter.grad.device, dtype=parameter.grad.dtype))
