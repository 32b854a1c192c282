"""Turn raw detector outputs into scored, labelled boxes in image pixels."""

from __future__ import annotations

import torch

from detrkit.ops.boxes import cxcywh_to_xyxy


def top_detections(logits: torch.Tensor, boxes: torch.Tensor, image_sizes: torch.Tensor,
                   num_select: int) -> list[dict[str, torch.Tensor]]:
    """Best (query, class) pairs per image.

    logits (B, Q, C), boxes (B, Q, 4) normalised cxcywh, image_sizes (B, 2) as (H, W).
    Returns per image {"scores" (K,), "labels" (K,), "boxes" (K, 4) xyxy pixels clamped to the
    image}, K = min(num_select, Q * C), sorted by descending score (ties keep query order).
    """
    batch, queries, classes = logits.shape
    probs = logits.sigmoid().flatten(1)  # (B, Q*C)
    keep = min(num_select, queries * classes)
    # top-k, then ordered as a stable descending sort would: equal scores keep index order
    scores, index = probs.topk(keep, dim=1)
    index, by_index = index.sort(dim=1)
    scores, by_score = scores.gather(1, by_index).sort(dim=1, descending=True, stable=True)
    index = index.gather(1, by_score)
    query = torch.div(index, classes, rounding_mode="floor")
    xyxy = cxcywh_to_xyxy(boxes).gather(1, query[..., None].expand(-1, -1, 4))
    height, width = image_sizes.to(xyxy.dtype).unbind(1)
    scale = torch.stack((width, height, width, height), 1)[:, None]  # (B, 1, 4)
    xyxy = torch.minimum((xyxy * scale).clamp(min=0), scale)
    labels = index % classes
    return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, xyxy)]
