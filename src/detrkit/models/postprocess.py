"""Turn raw detector outputs into scored, labelled boxes in image pixels."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from detrkit.ops.boxes import cxcywh_to_xyxy


def top_detections(logits: torch.Tensor, boxes: torch.Tensor, image_sizes: torch.Tensor,
                   num_select: int, masks: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
    """Best (query, class) pairs per image.

    logits (B, Q, C), boxes (B, Q, 4) normalised cxcywh, image_sizes (B, 2) as (H, W).
    Returns per image {"scores" (K,), "labels" (K,), "boxes" (K, 4) xyxy pixels clamped to the
    image}, K = min(num_select, Q * C), sorted by descending score (ties keep query order).
    With masks (B, Q, h, w) logits, also "masks" (K, h, w): the selected queries' logits, for
    masks_at_size to bring to an image size.
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
    results = [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, xyxy)]
    if masks is not None:
        picked = masks.gather(1, query[..., None, None].expand(-1, -1, *masks.shape[-2:]))  # (B, K, h, w)
        for result, image_masks in zip(results, picked):
            result["masks"] = image_masks
    return results


def masks_at_size(logits: torch.Tensor, valid: tuple[int, int], size: tuple[int, int],
                  chunk: int = 32) -> torch.Tensor:
    """(K, H, W) bool masks from (K, h, w) logits over a padded input: the top-left `valid` (rows,
    columns) cover the image; they are upsampled bilinearly (align_corners=False) to `size` and
    thresholded at 0. `chunk` masks at a time bound the float upsampling memory."""
    cropped = logits[:, :valid[0], :valid[1]].float()
    out = torch.empty((len(logits), *size), dtype=torch.bool, device=logits.device)
    for start in range(0, len(logits), chunk):
        part = cropped[start:start + chunk, None]  # (k, 1, hv, wv)
        out[start:start + chunk] = F.interpolate(part, size=size, mode="bilinear", align_corners=False)[:, 0] > 0
    return out


def valid_mask_region(mask_size: tuple[int, int], padded_size: tuple[int, int],
                      image_size: tuple[int, int]) -> tuple[int, int]:
    """Rows and columns of a (h, w) mask over a padded (H_pad, W_pad) input that cover the
    unpadded (H, W) image at its top left."""
    return tuple(min(m, math.ceil(i * m / p)) for m, p, i in zip(mask_size, padded_size, image_size))


def detections_above(result: dict[str, torch.Tensor], threshold: float,
                     image_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """One image's detections from `top_detections` scoring above `threshold` (strict). Their
    "masks" logits, taken over an unpadded input, become (N, H, W) bool masks at `image_size`:
    only the kept ones are upsampled."""
    keep = (result["scores"] > threshold).nonzero(as_tuple=True)[0]
    kept = {name: value[keep] for name, value in result.items()}
    if "masks" in kept:
        kept["masks"] = masks_at_size(kept["masks"], tuple(kept["masks"].shape[-2:]), image_size)
    return kept
