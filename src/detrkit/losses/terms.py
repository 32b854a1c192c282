"""Detection loss terms as pure functions of matched predictions and targets (spec 7.4, 7.5).

Matched pairs arrive flat: `matched_query` (M,) indexes the B*Q queries of a (B, Q, ...) output
(batch index * Q + query index), and the i-th matched prediction pairs with the i-th target.
Every term is a sum divided by `num_boxes`, a tensor, so nothing here waits for the device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detrkit.ops.boxes import cxcywh_to_xyxy, elementwise_generalized_box_iou


def ia_bce_loss(logits: torch.Tensor, matched_query: torch.Tensor, matched_labels: torch.Tensor,
                iou: torch.Tensor, num_boxes: torch.Tensor, alpha: float = 0.25) -> torch.Tensor:
    """IoU-aware BCE over all B*Q*C logits.

    logits (B, Q, C); matched_query (M,) flat query index; matched_labels (M,); iou (M,) of the
    matched pairs. Matched (query, label) entries take BCE towards t = max(σ(x)^α·IoU^(1−α), 0.01)
    (detached); every other entry is a negative weighted by σ(x)², i.e. σ(x)²·softplus(x).
    """
    flat = logits.flatten(0, 1)  # (B*Q, C)
    prob = flat.sigmoid()
    matched = (matched_query, matched_labels)
    soft_target = (prob[matched].pow(alpha) * iou.pow(1 - alpha)).clamp(min=0.01).detach()
    pos_weight = torch.zeros_like(flat).index_put(matched, soft_target)
    neg_weight = (prob**2).index_put(matched, 1 - soft_target)
    # w_neg·x − logσ(x)·(w_pos + w_neg) = w_pos·BCE(x, 1) + w_neg·BCE(x, 0)
    loss = neg_weight * flat - F.logsigmoid(flat) * (pos_weight + neg_weight)
    return loss.sum() / num_boxes


def l1_box_loss(pred_boxes: torch.Tensor, target_boxes: torch.Tensor, num_boxes: torch.Tensor) -> torch.Tensor:
    """Σ |b − b*| over matched (M, 4) cxcywh pairs and coordinates, / num_boxes."""
    return (pred_boxes - target_boxes).abs().sum() / num_boxes


def giou_box_loss(pred_boxes: torch.Tensor, target_boxes: torch.Tensor, num_boxes: torch.Tensor) -> torch.Tensor:
    """Σ (1 − GIoU) over matched (M, 4) cxcywh pairs, / num_boxes."""
    giou = elementwise_generalized_box_iou(cxcywh_to_xyxy(pred_boxes), cxcywh_to_xyxy(target_boxes))
    return (1 - giou).sum() / num_boxes
