"""Box format conversions and box-space arithmetic on (..., 4) tensors."""

from __future__ import annotations

import torch


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack((cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h), dim=-1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack(((x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0), dim=-1)


def apply_box_delta(delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Box re-parameterisation: shift the centre by delta_xy * base_wh, scale wh by exp(delta_wh)."""
    base_xy, base_wh = base[..., :2], base[..., 2:]
    return torch.cat((delta[..., :2] * base_wh + base_xy, delta[..., 2:].exp() * base_wh), dim=-1)
