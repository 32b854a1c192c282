"""One-to-one Hungarian matching of queries to ground truth, independently per query group.

All output layers of a step are matched together: their costs are computed on the device and
handed to one solver from `SOLVERS`. "scipy" moves them to the host in one copy, assigns there
and sends every index back in one copy; "torch_linear_assignment" (when installed) solves every
problem of the step in one batch on the costs' device. Segmentation outputs add point-sampled
mask costs (spec 8.2), keypoint outputs keypoint costs (spec 9).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from detrkit.losses.keypoints import keypoint_costs
from detrkit.losses.masks import mask_point_logits, pairwise_mask_costs, target_point_labels
from detrkit.losses.transfer import at_least_fp32, host_to_device
from detrkit.ops.boxes import cxcywh_to_xyxy, elementwise_generalized_box_iou
from detrkit.structures import MaskFactors, Target


@dataclass
class Matches:
    """Matched pairs of one layer, flat and image by image: query (M,) = image * Q + query, target
    (M,) into all targets; counts, on the host, the pairs of each image."""

    query: torch.Tensor
    target: torch.Tensor
    counts: list[int]


def at_least_fp32_masks(pred_masks: torch.Tensor | MaskFactors) -> torch.Tensor | MaskFactors:
    """`at_least_fp32` of dense mask logits or of each mask factor."""
    if isinstance(pred_masks, MaskFactors):
        return MaskFactors(*(at_least_fp32(t) for t in (pred_masks.spatial, pred_masks.queries, pred_masks.bias)))
    return at_least_fp32(pred_masks)


def l1_box_cost(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(Q, T, 4) predicted and (T, 4) target boxes -> (Q, T) sums of absolute coordinate differences."""
    return (pred - target).abs().sum(-1)


# The box cost as the matcher calls it: `l1_box_cost` or a compiled form of it.
BoxCost = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def focal_class_cost(logits: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """Focal-loss difference between labelling a query positive and negative, elementwise on the
    logits of the targets' classes."""
    prob = logits.sigmoid()
    positive = alpha * (1 - prob) ** gamma * -F.logsigmoid(logits)
    negative = (1 - alpha) * prob**gamma * -F.logsigmoid(-logits)
    return positive - negative


def non_finite_to_worst(cost: torch.Tensor) -> torch.Tensor:
    """Non-finite costs become max_finite + max|finite| + 1, dearer than any real match (0 when no
    cost is finite); computed where the costs are, without a host sync."""
    if not cost.numel():
        return cost
    finite = cost.isfinite()
    worst = torch.where(finite, cost, -torch.inf).amax() + torch.where(finite, cost.abs(), 0).amax() + 1
    return torch.where(finite, cost, worst.nan_to_num(neginf=0.0))


def replace_non_finite(cost: torch.Tensor) -> torch.Tensor:
    """non_finite_to_worst on host costs, with one warning when there is anything to replace."""
    if bool(cost.isfinite().all()):
        return cost
    warnings.warn("the matching cost has non-finite entries; treating them as the worst match", stacklevel=3)
    return non_finite_to_worst(cost)


# Mask logits of one output layer: dense (B, Q, h, w), factored while training, or None.
PredMasks = torch.Tensor | MaskFactors | None


class HungarianMatcher:
    """Matches each query group to the targets of each image at minimal focal + L1 + GIoU cost,
    plus mask BCE and dice costs for outputs and targets with masks, and keypoint L1, findable,
    visible and NLL costs for outputs and targets with keypoints (laid out by
    `num_keypoints_per_class`, keypoints.py)."""

    def __init__(self, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0,
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, solver: str | None = None,
                 box_cost: BoxCost = l1_box_cost, cost_mask_ce: float = 5.0, cost_mask_dice: float = 5.0,
                 mask_point_sample_ratio: int = 16, num_keypoints_per_class: list[int] | None = None,
                 cost_keypoint_l1: float = 1.0, cost_keypoint_findable: float = 1.0,
                 cost_keypoint_visible: float = 1.0, cost_keypoint_nll: float = 1.0) -> None:
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.cost_mask_ce, self.cost_mask_dice = cost_mask_ce, cost_mask_dice
        self.num_keypoints_per_class = num_keypoints_per_class
        self.keypoint_weights = (cost_keypoint_l1, cost_keypoint_findable, cost_keypoint_visible, cost_keypoint_nll)
        self.mask_point_sample_ratio = mask_point_sample_ratio
        self.box_cost = box_cost
        self.focal_alpha, self.focal_gamma = focal_alpha, focal_gamma
        solver = solver or DEFAULT_SOLVER
        if solver not in SOLVERS:
            raise ValueError(f"unknown assignment solver {solver!r}; available: {sorted(SOLVERS)} "
                             "('torch_linear_assignment' needs `pip install torch-linear-assignment`)")
        self.solve: Solver = SOLVERS[solver]

    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor,
                    target_boxes: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """Each target against the queries of its own image: logits (B, Q, C), boxes (B, Q, 4)
        cxcywh; labels (T,), target_boxes (T, 4) cxcywh, image (T,) -> (Q, T)."""
        logits, boxes = at_least_fp32(logits), at_least_fp32(boxes)
        class_logits = logits[image, :, labels].T  # (Q, T)
        pred = boxes[image].transpose(0, 1)  # (Q, T, 4)
        target_boxes = target_boxes.to(boxes.dtype)
        box_cost = self.box_cost(pred, target_boxes)
        giou_cost = -elementwise_generalized_box_iou(cxcywh_to_xyxy(pred), cxcywh_to_xyxy(target_boxes))
        class_cost = focal_class_cost(class_logits, self.focal_alpha, self.focal_gamma)
        return self.cost_bbox * box_cost + self.cost_class * class_cost + self.cost_giou * giou_cost

    def mask_points(self, pred_masks: torch.Tensor | MaskFactors) -> torch.Tensor:
        """h·w // ratio uniform points (1, P, 2), one draw shared by every query and target."""
        spatial = pred_masks.spatial if isinstance(pred_masks, MaskFactors) else pred_masks
        count = spatial.shape[-2] * spatial.shape[-1] // self.mask_point_sample_ratio
        return torch.rand(1, count, 2, device=spatial.device)

    def mask_costs(self, pred_masks: torch.Tensor | MaskFactors, target_masks: torch.Tensor,
                   image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted mask BCE and dice costs, each (Q, T), of each target against the queries of its
        image at `mask_points`; target_masks (T, H, W) padded to the input size."""
        points = self.mask_points(pred_masks)
        logits = mask_point_logits(at_least_fp32_masks(pred_masks), points)  # (B, Q, P)
        labels = target_point_labels(target_masks, points.expand(len(target_masks), -1, -1)).to(logits.dtype)
        # every query against every target, as one product; each target then keeps its own image's
        ce, dice = (cost.view(*logits.shape[:2], -1) for cost in pairwise_mask_costs(logits.flatten(0, 1), labels))
        targets = torch.arange(len(image), device=image.device)
        return self.cost_mask_ce * ce[image, :, targets].T, self.cost_mask_dice * dice[image, :, targets].T

    def keypoint_costs(self, pred_keypoints: torch.Tensor, labels: torch.Tensor, target_boxes: torch.Tensor,
                       target_keypoints: torch.Tensor, image: torch.Tensor) -> list[torch.Tensor]:
        """Weighted keypoint L1, findable, visible and NLL costs, each (Q, T), of each target against
        the queries of its image: pred_keypoints (B, Q, C·K, 8), target_keypoints (T, K, 3),
        target_boxes (T, 4) cxcywh."""
        if not self.num_keypoints_per_class:
            raise ValueError("keypoint outputs need num_keypoints_per_class (ModelConfig) to be matched")
        pred_keypoints = at_least_fp32(pred_keypoints)
        area = target_boxes[:, 2].to(pred_keypoints.dtype) * target_boxes[:, 3].to(pred_keypoints.dtype)
        costs = keypoint_costs(pred_keypoints, image, labels, target_keypoints, area, self.num_keypoints_per_class)
        return [weight * cost for weight, cost in zip(self.keypoint_weights, costs)]

    @torch.no_grad()
    def match_layers(self, layers: list[tuple[torch.Tensor, torch.Tensor]], targets: list[Target], groups: int,
                     masks: list[PredMasks] | None = None, target_masks: torch.Tensor | None = None,
                     keypoints: list[torch.Tensor | None] | None = None,
                     target_keypoints: torch.Tensor | None = None) -> list[Matches]:
        """(logits (B, Q, C), boxes (B, Q, 4) cxcywh) of each output layer -> its matches on the
        logits' device; layers may differ in Q, each splits into `groups` equal query blocks.
        masks: each layer's mask logits, costed where given and `target_masks` (T, H, W), every
        image's masks padded to the input size, are too. keypoints: each layer's (B, Q, C·K, 8)
        keypoints, costed where given and `target_keypoints` (T, K, 3) are too."""
        for logits, _ in layers:
            if logits.shape[1] % groups:
                raise ValueError(f"{logits.shape[1]} queries do not split into {groups} equal groups")
        masks = [m if target_masks is not None else None for m in masks or [None] * len(layers)]
        keypoints = [k if target_keypoints is not None else None for k in keypoints or [None] * len(layers)]
        sizes = [len(t.labels) for t in targets]
        if not sum(sizes):  # nothing to assign, nothing to wait for
            for pred_masks in masks:  # but the points are drawn, keeping the reference's random stream
                if pred_masks is not None:
                    self.mask_points(pred_masks)
            empty = torch.zeros(0, dtype=torch.int64, device=layers[0][0].device)
            return [Matches(empty, empty, [0] * len(sizes)) for _ in layers]
        labels = torch.cat([t.labels for t in targets])
        target_boxes = torch.cat([t.boxes for t in targets])
        image = torch.cat([t.labels.new_full(t.labels.shape, i) for i, t in enumerate(targets)])  # (T,)
        costs = []
        for (logits, boxes), pred_masks, pred_keypoints in zip(layers, masks, keypoints):
            cost = self.cost_matrix(logits, boxes, labels, target_boxes, image)
            if pred_masks is not None:
                mask_ce, mask_dice = self.mask_costs(pred_masks, target_masks, image)
                cost = cost + mask_ce + mask_dice
            if pred_keypoints is not None:  # added one by one, in the reference's order
                for term in self.keypoint_costs(pred_keypoints, labels, target_boxes, target_keypoints, image):
                    cost = cost + term
            costs.append(cost)
        return self.solve(costs, sizes, groups)

    def __call__(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[Target], groups: int,
                 pred_masks: PredMasks = None, target_masks: torch.Tensor | None = None,
                 pred_keypoints: torch.Tensor | None = None, target_keypoints: torch.Tensor | None = None) -> Matches:
        """One output layer: logits (B, Q, C), boxes (B, Q, 4) cxcywh -> its matches."""
        return self.match_layers([(logits, boxes)], targets, groups, [pred_masks], target_masks,
                                 [pred_keypoints], target_keypoints)[0]


# A solver takes each layer's (Q, T) costs, the targets per image and the query groups, and
# returns each layer's matches on the costs' device.
Solver = Callable[[list[torch.Tensor], list[int], int], list[Matches]]


def pair_counts(cost: torch.Tensor, sizes: list[int], groups: int) -> list[int]:
    """Matched pairs per image of a layer with (Q, T) costs: each query block pairs min(Q/G, T_i)."""
    return [groups * min(cost.shape[0] // groups, size) for size in sizes]


def scipy_solver(costs: list[torch.Tensor], sizes: list[int], groups: int) -> list[Matches]:
    """SciPy per layer, image and group on the host: every cost goes there in one copy, every
    index comes back in one."""
    # the one host sync of the training step: SciPy needs the costs on the CPU
    host = replace_non_finite(torch.cat([cost.flatten() for cost in costs]).cpu())
    pieces: list[np.ndarray] = []  # query, target of layer 0, of layer 1, ...
    for cost, flat in zip(costs, host.split([cost.numel() for cost in costs])):
        pieces.extend(assign_layer(flat.view(cost.shape).numpy(), sizes, groups))
    indices = host_to_device(torch.from_numpy(np.concatenate(pieces)), costs[0].device)
    back = indices.split([len(piece) for piece in pieces])
    return [Matches(back[2 * i], back[2 * i + 1], pair_counts(cost, sizes, groups)) for i, cost in enumerate(costs)]


def assign_layer(cost: np.ndarray, sizes: list[int], groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, T) costs of one layer -> flat (query, target) indices of an optimal assignment within
    each image's targets and each of `groups` contiguous query blocks."""
    queries = cost.shape[0]
    block = queries // groups
    starts = np.cumsum([0, *sizes[:-1]])
    query, target = [], []
    for image, (start, size) in enumerate(zip(starts, sizes)):
        for g in range(groups):
            rows, cols = linear_sum_assignment(cost[g * block:(g + 1) * block, start:start + size])
            query.append(rows + image * queries + g * block)
            target.append(cols + start)
    return np.concatenate(query), np.concatenate(target)


def batched_solver(costs: list[torch.Tensor], sizes: list[int], groups: int) -> list[Matches]:
    """torch_linear_assignment on the costs' device: the (image, group) problems of all layers
    with one query block size in one batch, each image's targets padded to the most any has."""
    from torch_linear_assignment import batch_linear_assignment

    images, slots, device = len(sizes), max(sizes), costs[0].device
    blocks = [cost.shape[0] // groups for cost in costs]
    if min(blocks) < slots:
        raise ValueError(f"{max(sizes)} targets in one image but only {min(blocks)} queries per group")
    layout = host_to_device(padded_layout(sizes, groups), device)
    column = layout[:images * slots].view(images, slots)
    position, image, group, target = layout[images * slots:].view(4, -1)  # each (M,): real slots
    rows: dict[int, torch.Tensor] = {}  # layer -> (B*G, slots): the query row given each slot
    for block in sorted(set(blocks)):
        layers = [i for i, b in enumerate(blocks) if b == block]
        problems = torch.cat([padded_problems(costs[i], groups, column) for i in layers])
        solved = batch_linear_assignment(non_finite_to_worst(problems))  # (N, block): slot or -1
        rows.update(zip(layers, row_of_slot(solved, slots).split(images * groups)))
    return [Matches(image * cost.shape[0] + group * block + rows[i].flatten()[position], target,
                    pair_counts(cost, sizes, groups)) for i, (cost, block) in enumerate(zip(costs, blocks))]


def padded_layout(sizes: list[int], groups: int) -> torch.Tensor:
    """Host-known indices of the padded problems, in one int64 tensor: the target of each
    (image, slot) (B*S, T for padding), then for every real (image, group, slot) its flat
    position in (B, G, S), its image, group and target (4 x M)."""
    count = torch.tensor(sizes)
    start = count.cumsum(0) - count
    image, group, slot = torch.meshgrid(torch.arange(len(sizes)), torch.arange(groups), torch.arange(max(sizes)),
                                        indexing="ij")  # each (B, G, S)
    real = slot < count[image]
    target = start[image] + slot
    column = torch.where(real, target, sum(sizes))[:, 0]  # (B, S)
    position = torch.arange(real.numel()).view(real.shape)
    return torch.cat([column.flatten(), *(index[real] for index in (position, image, group, target))])


def padded_problems(cost: torch.Tensor, groups: int, column: torch.Tensor) -> torch.Tensor:
    """(Q, T) costs of one layer -> (B*G, Q/G, S) problems; padding slots cost 0 for every
    query, which leaves the optimal assignment of the real slots unchanged."""
    padded = F.pad(cost, (0, 1))[:, column]  # (Q, B, S): the appended zero column pads
    queries = cost.shape[0]
    return padded.view(groups, queries // groups, *column.shape).permute(2, 0, 1, 3).flatten(0, 1)


def row_of_slot(solved: torch.Tensor, slots: int) -> torch.Tensor:
    """(N, W) slot of each row (or -1) -> (N, S) row of each slot; every slot has one when W >= S."""
    rows = solved.new_zeros(solved.shape[0], slots + 1)  # the last column takes the unassigned rows
    every_row = torch.arange(solved.shape[1], device=solved.device).expand_as(solved)
    return rows.scatter_(1, torch.where(solved >= 0, solved, slots), every_row)[:, :slots]


SOLVERS: dict[str, Solver] = {"scipy": scipy_solver}
if importlib.util.find_spec("torch_linear_assignment") is not None:
    SOLVERS["torch_linear_assignment"] = batched_solver
# what HungarianMatcher() uses: SciPy until benchmarks/matcher.py shows the batched solver faster on a GPU
DEFAULT_SOLVER = "scipy"
