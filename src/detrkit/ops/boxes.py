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
    """Box re-parameterisation: shift the centre by delta_xy * base_wh, scale wh by exp(delta_wh).

    Computed in fp32 whatever the inputs' dtype: under bf16 autocast the heads emit 8-bit
    mantissas, about a pixel at 640 px, and every decoder layer refines from these boxes."""
    delta, base = delta.float(), base.float()
    base_xy, base_wh = base[..., :2], base[..., 2:]
    return torch.cat((delta[..., :2] * base_wh + base_xy, delta[..., 2:].exp() * base_wh), dim=-1)


BOX_EPS = 1e-7  # guards only degenerate (zero) unions and enclosures, spec 7.5


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of (..., 4) xyxy boxes."""
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def _intersection_union(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Intersection and union areas of broadcastable (..., 4) xyxy boxes."""
    top_left = torch.maximum(a[..., :2], b[..., :2])
    bottom_right = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    return inter, box_area(a) + box_area(b) - inter


def elementwise_box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matched pairs: broadcastable (..., 4) xyxy boxes -> (...)."""
    inter, union = _intersection_union(a, b)
    return inter / union.clamp(min=BOX_EPS)


def elementwise_generalized_box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GIoU of matched pairs: IoU minus the share of the enclosing box covered by neither."""
    inter, union = _intersection_union(a, b)
    enclosing_wh = torch.maximum(a[..., 2:], b[..., 2:]) - torch.minimum(a[..., :2], b[..., :2])
    enclosure = enclosing_wh.clamp(min=0).prod(-1)
    return inter / union.clamp(min=BOX_EPS) - (enclosure - union) / enclosure.clamp(min=BOX_EPS)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU: (N, 4) x (M, 4) xyxy -> (N, M)."""
    return elementwise_box_iou(a[:, None], b[None, :])


def generalized_box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise GIoU: (N, 4) x (M, 4) xyxy -> (N, M)."""
    return elementwise_generalized_box_iou(a[:, None], b[None, :])
