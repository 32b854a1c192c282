"""Keypoint matching costs and losses as pure functions of keypoint predictions and ground truth (spec 9).

A prediction slot holds 8 channels, [x, y, findable, visible, log_l11, l21, log_l22, class]; x, y
are normalised image coordinates and (log_l11, l21, log_l22) the Cholesky factor L of the
precision L·Lᵀ. Slots are laid out per keypoint class, (C·K, 8) with K the most keypoints of any
class: a target of label c reads block c, whose first schema[c] slots are active; a label beyond
the schema has none. Ground truth (N, K, 3) holds x, y normalised and the visibility v (0
unlabeled, 1 occluded, 2 visible); area is the normalised box w·h. The losses keep non-finite
inputs out of every term, values and gradients alike, by replacing them before any arithmetic;
the costs drop non-finite locations and Cholesky terms, while a non-finite logit leaves its pair's
cost non-finite, which the matcher prices as the worst match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detrkit.losses.transfer import host_to_device

def check_layout(pred_slots: int, target_slots: int, schema: list[int]) -> None:
    """Predictions need C·K slots and targets K, for C = len(schema) classes of K = max(schema)."""
    if pred_slots != len(schema) * max(schema) or target_slots != max(schema):
        raise ValueError(f"keypoint predictions have {pred_slots} slots and targets {target_slots}; the schema "
                         f"{schema} needs {len(schema) * max(schema)} and {max(schema)}")


def class_slots(labels: torch.Tensor, schema: list[int], slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """labels (N,) -> the keypoint block of each label (N,) (0 beyond the schema) and its active
    slots (N, K) of `slots` = K; built from host-known sizes, with no device sync."""
    counts = host_to_device(torch.tensor(schema + [0]), labels.device)  # the extra 0: labels beyond the schema
    known = labels.clamp(max=len(schema))
    active = torch.arange(slots, device=labels.device) < counts[known][:, None]
    return known.clamp(max=len(schema) - 1), active


def select_keypoints(pred_keypoints: torch.Tensor, labels: torch.Tensor,
                     schema: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Matched predictions (M, C·K, 8) and their target labels (M,) -> each one's class block
    (M, K, 8) and its active slots (M, K)."""
    classes = len(schema)
    slots = pred_keypoints.shape[1] // classes
    block, active = class_slots(labels, schema, slots)
    blocks = pred_keypoints.unflatten(1, (classes, slots))  # (M, C, K, 8)
    return blocks[torch.arange(len(labels), device=labels.device), block], active


def area_terms(area: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """area (N,) -> valid (N,) (finite and above the dtype's eps) and a safe area, 1 where invalid."""
    eps = torch.finfo(area.dtype).eps
    valid = area.isfinite() & (area > eps)
    return valid, torch.where(valid, area, torch.ones_like(area)).clamp(min=eps)


def labelled(target: torch.Tensor, active: torch.Tensor, valid_area: torch.Tensor) -> torch.Tensor:
    """Slots (N, K) that carry a location: active, v > 0, finite ground-truth x, y, valid area."""
    return active & (target[..., 2] > 0) & target[..., :2].isfinite().all(-1) & valid_area[:, None]


def precision_terms(dx: torch.Tensor, dy: torch.Tensor, log_l11: torch.Tensor, l21: torch.Tensor,
                    log_l22: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """u = Lᵀ·(dx, dy) for L = [[e^log_l11, 0], [l21, e^log_l22]] -> (u0, u1, |u|²), elementwise."""
    u0 = log_l11.exp() * dx + l21 * dy
    u1 = log_l22.exp() * dy
    return u0, u1, u0 * u0 + u1 * u1


def finite_nll(maha2: torch.Tensor, area: torch.Tensor, log_det: torch.Tensor) -> torch.Tensor:
    """0.5·maha2 / area − log det L, overflow clamped to ±max/2 as the reference does."""
    nll = 0.5 * (maha2 / area) - log_det
    info = torch.finfo(nll.dtype)
    return torch.nan_to_num(nll, nan=0.0, posinf=info.max / 2, neginf=info.min)


def keypoint_losses(pred: torch.Tensor, target: torch.Tensor, active: torch.Tensor,
                    area: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per matched pair (M,): location L1, findable BCE, visible BCE and Gaussian NLL.

    pred (M, K, 8) each pair's class block, target (M, K, 3), active (M, K), area (M,).
    l1 = Σ_located (|dx|+|dy|) / sqrt(area) / max(1, #located); findable and visible = mean over
    active slots of BCE(logit, v > 0) and BCE(logit, v > 1); nll = mean over located slots of
    0.5·|Lᵀd|²/area − (log_l11 + log_l22), 0 with none located.
    """
    valid_area, safe_area = area_terms(area)
    located = labelled(target, active, valid_area) & pred[..., :2].isfinite().all(-1)  # (M, K)
    dxy = torch.where(located[..., None], pred[..., :2] - target[..., :2].to(pred.dtype), 0)  # (M, K, 2)
    per_slot = torch.where(located, dxy.abs().sum(-1), 0) / safe_area.sqrt()[:, None]
    l1 = per_slot.sum(-1) / located.sum(-1).clamp(min=1)
    findable = masked_bce_mean(pred[..., 2], target[..., 2] > 0, active)
    visible = masked_bce_mean(pred[..., 3], target[..., 2] > 1, active)
    return l1, findable, visible, nll_loss(pred, dxy, located, safe_area)


def masked_bce_mean(logits: torch.Tensor, truth: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Mean BCE with logits (M, K) over active slots with a finite logit, per row (M,)."""
    kept = active & logits.isfinite()
    bce = F.binary_cross_entropy_with_logits(torch.where(kept, logits, 0), truth.to(logits.dtype), reduction="none")
    return torch.where(kept, bce, 0).sum(-1) / kept.sum(-1).clamp(min=1)


def nll_loss(pred: torch.Tensor, dxy: torch.Tensor, located: torch.Tensor, safe_area: torch.Tensor) -> torch.Tensor:
    """Mean Gaussian NLL (M,) over located slots whose Cholesky terms, and u, are finite."""
    chol = pred[..., 4:7]  # (M, K, 3): log_l11, l21, log_l22
    kept = located & chol.isfinite().all(-1)
    parts = torch.where(kept[..., None], torch.cat([dxy, chol], -1), 0)
    # a finite log-precision may still overflow once exponentiated: drop those slots too
    kept = kept & torch.stack(precision_terms(*parts.unbind(-1)), -1).isfinite().all(-1)
    dx, dy, log_l11, l21, log_l22 = torch.where(kept[..., None], parts, 0).unbind(-1)
    maha2 = precision_terms(dx, dy, log_l11, l21, log_l22)[2]
    nll = torch.where(kept, finite_nll(maha2, safe_area[:, None], log_l11 + log_l22), 0)
    return nll.sum(-1) / kept.sum(-1).clamp(min=1)


@torch.no_grad()
def keypoint_costs(pred_keypoints: torch.Tensor, image: torch.Tensor, labels: torch.Tensor, target: torch.Tensor,
                   area: torch.Tensor, schema: list[int]) -> tuple[torch.Tensor, ...]:
    """Each target against every query of its image: L1, findable, visible and NLL costs, each (Q, T).

    pred_keypoints (B, Q, C·K, 8); image, labels, area (T,); target (T, K, 3). L1 and NLL are
    means over the target's labelled slots (0 with none), L1 area-normalised by sqrt(area);
    findable and visible are BCE sums over the active slots / their number.
    """
    check_layout(pred_keypoints.shape[2], target.shape[1], schema)
    block, active = class_slots(labels, schema, target.shape[1])
    pred = pred_keypoints.unflatten(2, (len(schema), -1))[image, :, block]  # (T, Q, K, 8)
    valid_area, safe_area = area_terms(area)
    located = labelled(target, active, valid_area)[:, None]  # (T, 1, K)
    count = located.sum(-1).clamp(min=1)  # (T, 1)
    dxy = pred[..., :2] - target[:, None, :, :2].to(pred.dtype)  # (T, Q, K, 2)
    finite_xy = dxy.isfinite().all(-1)
    l1 = torch.where(located & finite_xy, dxy.abs().sum(-1), 0).sum(-1) / count / safe_area.sqrt()[:, None]
    log_l11, l21, log_l22 = pred[..., 4:7].unbind(-1)
    u0, u1, maha2 = precision_terms(*dxy.unbind(-1), log_l11, l21, log_l22)
    kept = located & finite_xy & torch.stack([log_l11, l21, log_l22, u0, u1, maha2], -1).isfinite().all(-1)
    nll_terms = finite_nll(maha2, safe_area[:, None, None], log_l11 + log_l22)
    nll = torch.where(kept, nll_terms, 0).sum(-1) / count
    findable = pairwise_bce(pred[..., 2], target[..., 2] > 0, active)
    visible = pairwise_bce(pred[..., 3], target[..., 2] > 1, active)
    return tuple(cost.T for cost in (l1, findable, visible, nll))


def pairwise_bce(logits: torch.Tensor, truth: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """logits (T, Q, K) against truth (T, K) -> Σ_active (softplus(x) − x·t) / #active, (T, Q)."""
    active = active[:, None]
    softplus = torch.where(active, F.softplus(logits), 0).sum(-1)
    agreement = torch.where(active, logits * truth[:, None].to(logits.dtype), 0).sum(-1)
    return (softplus - agreement) / active.sum(-1).clamp(min=1)
