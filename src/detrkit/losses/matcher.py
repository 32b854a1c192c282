"""One-to-one Hungarian matching of queries to ground truth, independently per query group."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from detrkit.ops.boxes import cxcywh_to_xyxy, generalized_box_iou
from detrkit.structures import Target


def focal_class_cost(logits: torch.Tensor, labels: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """Focal-loss difference between labelling a query positive and negative: (P, C), (T,) -> (P, T)."""
    x = logits[:, labels]
    prob = x.sigmoid()
    positive = alpha * (1 - prob) ** gamma * -F.logsigmoid(x)
    negative = (1 - alpha) * prob**gamma * -F.logsigmoid(-x)
    return positive - negative


def replace_non_finite(cost: torch.Tensor) -> torch.Tensor:
    """Non-finite costs become max_finite + max|finite| + 1, dearer than any real match (one warning)."""
    finite = cost.isfinite()
    if bool(finite.all()):
        return cost
    warnings.warn("the matching cost has non-finite entries; treating them as the worst match", stacklevel=3)
    values = cost[finite]
    worst = values.max() + values.abs().max() + 1 if values.numel() else torch.zeros((), dtype=cost.dtype)
    return torch.where(finite, cost, worst)


class HungarianMatcher:
    """Matches each query group to the targets of each image at minimal focal + L1 + GIoU cost."""

    def __init__(self, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0) -> None:
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma

    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                    target_boxes: torch.Tensor) -> torch.Tensor:
        """(P, C) logits, (P, 4) cxcywh boxes against (T,) labels, (T, 4) cxcywh boxes -> (P, T)."""
        class_cost = focal_class_cost(logits, labels, self.focal_alpha, self.focal_gamma)
        box_cost = torch.cdist(boxes, target_boxes, p=1)
        giou_cost = -generalized_box_iou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(target_boxes))
        return self.cost_bbox * box_cost + self.cost_class * class_cost + self.cost_giou * giou_cost

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[Target],
                 groups: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """logits (B, Q, C), boxes (B, Q, 4) cxcywh; per image (query indices, target indices), int64 on CPU."""
        batch, queries, _ = logits.shape
        if queries % groups:
            raise ValueError(f"{queries} queries do not split into {groups} equal groups")
        labels = torch.cat([t.labels for t in targets])
        target_boxes = torch.cat([t.boxes for t in targets]).float()
        cost = self.cost_matrix(logits.flatten(0, 1).float(), boxes.flatten(0, 1).float(), labels, target_boxes)
        # the one host sync of the training step: scipy needs the costs on the CPU
        cost = replace_non_finite(cost.view(batch, queries, -1).cpu())  # (B, Q, T) against all targets
        per_image = cost.split([len(t.labels) for t in targets], dim=-1)  # image i: (Q, T_i) = per_image[i][i]
        return [assign_groups(image_cost[i], groups) for i, image_cost in enumerate(per_image)]


def assign_groups(cost: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, T) costs of one image -> an optimal assignment within each of `groups` contiguous query blocks."""
    block = cost.shape[0] // groups
    query_index, target_index = [], []
    for g in range(groups):
        rows, cols = linear_sum_assignment(cost[g * block:(g + 1) * block].numpy())
        query_index.append(torch.as_tensor(rows, dtype=torch.int64) + g * block)
        target_index.append(torch.as_tensor(cols, dtype=torch.int64))
    return torch.cat(query_index), torch.cat(target_index)
