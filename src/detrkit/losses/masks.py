"""Point-sampled mask costs and losses as pure functions of mask logits and ground truth (spec 8.2, 8.3).

Mask logits come either dense, (B, Q, h, w), or as `MaskFactors` (while training), whose logit of
query q at a pixel is spatial . query + bias. Points are (x, y) in [0, 1] over the padded input
image, so ground-truth masks are first padded (bottom, right) to the padded input size.
Matched pairs arrive flat, image by image, as in `terms.py`; `counts` says how many matched pairs
each image has, known on the host, so nothing here waits for the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detrkit.structures import MaskFactors

OVERSAMPLE = 3  # uniform candidates per kept point for importance sampling
IMPORTANCE = 0.75  # share of the points taken from the most uncertain candidates


def point_sample(images: torch.Tensor, points: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """images (N, C, H, W) at points (N, P, 2) of (x, y) in [0, 1] -> (N, C, P); border padding,
    align_corners=False (pixel centres at (i + 0.5) / size)."""
    grid = 2.0 * points.to(images.dtype) - 1.0
    return F.grid_sample(images, grid[:, :, None], mode=mode, padding_mode="border", align_corners=False)[..., 0]


def pad_target_masks(masks: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
    """Each image's (N_i, H_i, W_i) masks padded with zeros at the bottom and right to `size`
    (H, W) and concatenated -> (T, H, W)."""
    height, width = size
    for image, mask in enumerate(masks):
        if mask.shape[-2] > height or mask.shape[-1] > width:
            raise ValueError(f"image {image}: target masks of {tuple(mask.shape[-2:])} exceed the padded "
                             f"input size {(height, width)}")
    if all(tuple(mask.shape[-2:]) == (height, width) for mask in masks):
        return torch.cat(masks)
    padded = masks[0].new_zeros((sum(len(mask) for mask in masks), height, width))
    start = 0
    for mask in masks:
        padded[start:start + len(mask), :mask.shape[-2], :mask.shape[-1]] = mask
        start += len(mask)
    return padded


def mask_point_logits(pred_masks: torch.Tensor | MaskFactors, points: torch.Tensor) -> torch.Tensor:
    """Logits of every query at the same P points (1, P, 2) -> (B, Q, P); factored masks sample
    the pixel features, then take the dot product with each query."""
    if isinstance(pred_masks, MaskFactors):
        spatial = pred_masks.spatial
        sampled = point_sample(spatial, points.expand(spatial.shape[0], -1, -1))  # (B, D, P)
        return torch.einsum("bdp,bqd->bqp", sampled, pred_masks.queries) + pred_masks.bias
    batch, queries = pred_masks.shape[:2]
    flat = pred_masks.flatten(0, 1)[:, None]  # (B*Q, 1, h, w)
    return point_sample(flat, points.expand(flat.shape[0], -1, -1)).view(batch, queries, -1)


def target_point_labels(target_masks: torch.Tensor, points: torch.Tensor,
                        rows: torch.Tensor | None = None) -> torch.Tensor:
    """Nearest-pixel values of (T, H, W) masks at points (N, P, 2) -> (N, P) floats, mask
    rows[n] (default n) at points[n]. The same pixels as grid_sample's nearest mode with border
    padding and align_corners=False (the same float arithmetic, rounding half to even), read by
    indexing: no float copy of any mask is made."""
    height, width = target_masks.shape[-2:]
    grid = 2.0 * points - 1.0
    x = (((grid[..., 0] + 1) * width - 1) / 2).clamp(0, width - 1).round().long()
    y = (((grid[..., 1] + 1) * height - 1) / 2).clamp(0, height - 1).round().long()
    if rows is None:
        rows = torch.arange(len(points), device=points.device)
    return target_masks[rows[:, None], y, x].to(points.dtype)


def pairwise_mask_costs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Point logits (N, P) of N predictions against point labels (T, P) of T targets -> mean
    point BCE (N, T) and dice cost 1 - (2 Σσ(x)t + 1) / (Σσ(x) + Σt + 1) (N, T)."""
    positive = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits), reduction="none")
    negative = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
    ce = torch.einsum("np,tp->nt", positive, labels) + torch.einsum("np,tp->nt", negative, 1 - labels)
    prob = logits.sigmoid()
    overlap = 2 * torch.einsum("np,tp->nt", prob, labels)
    total = prob.sum(-1)[:, None] + labels.sum(-1)[None, :]
    return ce / logits.shape[1], 1 - (overlap + 1) / (total + 1)


def matched_mask_logits(pred_masks: torch.Tensor | MaskFactors, matched_query: torch.Tensor,
                        counts: list[int]) -> torch.Tensor:
    """Dense (M, h, w) logits of the matched queries only; matched_query (M,) flat = image * Q +
    query, grouped by image, `counts` pairs per image. Factored masks are multiplied out for the
    matched queries of all images in one batched product (each image's rows padded to the most
    matches), so no (B, Q, h, w) tensor is made and the backward writes the pixel features'
    gradient once, not once per image."""
    if not isinstance(pred_masks, MaskFactors):
        return pred_masks.flatten(0, 1)[matched_query]
    spatial, queries = pred_masks.spatial, pred_masks.queries
    (batch, num_queries, dim), (height, width) = queries.shape, spatial.shape[-2:]
    device = matched_query.device
    image = torch.repeat_interleave(torch.arange(batch, device=device), torch.tensor(counts, device=device))
    starts = torch.tensor([0, *counts[:-1]], device=device).cumsum(0)
    slot = torch.arange(len(matched_query), device=device) - starts[image]
    rows = matched_query.new_zeros(batch, max(counts))  # padding rows take query 0; they are dropped below
    rows[image, slot] = matched_query - image * num_queries
    chosen = queries.gather(1, rows[..., None].expand(-1, -1, dim))  # (B, n, D)
    logits = torch.bmm(chosen, spatial.flatten(2))  # (B, n, h*w)
    return logits[image, slot].view(-1, height, width) + pred_masks.bias


@torch.no_grad()
def uncertain_points(mask_logits: torch.Tensor, num_points: int) -> torch.Tensor:
    """(M, h, w) logits -> (M, num_points, 2) points: of OVERSAMPLE * num_points uniform draws,
    the int(IMPORTANCE * num_points) with the smallest |logit|, then fresh uniform draws."""
    matched = mask_logits.shape[0]
    candidates = torch.rand(matched, OVERSAMPLE * num_points, 2, device=mask_logits.device)
    uncertainty = -point_sample(mask_logits[:, None], candidates)[:, 0].abs()  # (M, 3P)
    kept = int(IMPORTANCE * num_points)
    chosen = uncertainty.topk(kept, dim=1).indices
    points = candidates.gather(1, chosen[..., None].expand(-1, -1, 2))
    fresh = torch.rand(matched, num_points - kept, 2, device=mask_logits.device)
    return torch.cat([points, fresh], dim=1)


def mask_ce_loss(point_logits: torch.Tensor, labels: torch.Tensor, num_boxes: torch.Tensor) -> torch.Tensor:
    """Σ over matched masks of the mean point BCE, (M, P) logits and labels, / num_boxes."""
    loss = F.binary_cross_entropy_with_logits(point_logits, labels, reduction="none")
    return loss.mean(1).sum() / num_boxes


def mask_dice_loss(point_logits: torch.Tensor, labels: torch.Tensor, num_boxes: torch.Tensor) -> torch.Tensor:
    """Σ over matched masks of 1 - (2 Σσ(x)t + 1) / (Σσ(x) + Σt + 1), / num_boxes."""
    prob = point_logits.sigmoid()
    overlap = 2 * (prob * labels).sum(-1)
    return (1 - (overlap + 1) / (prob.sum(-1) + labels.sum(-1) + 1)).sum() / num_boxes


def point_mask_losses(pred_masks: torch.Tensor | MaskFactors, matched_query: torch.Tensor, counts: list[int],
                      target_masks: torch.Tensor, matched_target: torch.Tensor, num_boxes: torch.Tensor,
                      point_sample_ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """loss_mask_ce and loss_mask_dice of one output layer at importance-sampled points:
    max(h, h·w // ratio) points per matched pair; zero, still connected to every mask input,
    when nothing is matched."""
    if not sum(counts):
        inputs = [pred_masks.spatial, pred_masks.queries, pred_masks.bias] \
            if isinstance(pred_masks, MaskFactors) else [pred_masks]
        zero = sum(tensor.sum() for tensor in inputs) * 0.0
        return zero, zero
    logits = matched_mask_logits(pred_masks, matched_query, counts)  # (M, h, w)
    height, width = logits.shape[-2:]
    points = uncertain_points(logits, max(height, height * width // point_sample_ratio))
    point_logits = point_sample(logits[:, None], points)[:, 0]  # (M, P)
    labels = target_point_labels(target_masks, points, rows=matched_target).to(point_logits.dtype)
    return mask_ce_loss(point_logits, labels, num_boxes), mask_dice_loss(point_logits, labels, num_boxes)
