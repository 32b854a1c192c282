"""Slow, loop-by-loop twins of the matcher costs and loss terms, in Python floats."""

from __future__ import annotations

import itertools
import math


def xyxy(box: list[float]) -> list[float]:
    cx, cy, w, h = box
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def iou_giou(a: list[float], b: list[float]) -> tuple[float, float]:
    """IoU and GIoU of two xyxy boxes, eps only against zero union / enclosure."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    iou = inter / max(union, 1e-7)
    return iou, iou - (hull - union) / max(hull, 1e-7)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def pair_cost(logits: list[float], box: list[float], label: int, target: list[float]) -> float:
    """5·L1 + 2·focal class cost + 2·(−GIoU) for one query and one target."""
    p = sigmoid(logits[label])
    focal = 0.25 * (1 - p) ** 2 * -math.log(p) - 0.75 * p**2 * -math.log(1 - p)
    l1 = sum(abs(u - v) for u, v in zip(box, target))
    return 5 * l1 + 2 * focal - 2 * iou_giou(xyxy(box), xyxy(target))[1]


def brute_force_assign(cost: list[list[float]]) -> tuple[float, dict[int, int]]:
    """Cheapest injective map target -> query by trying every permutation; (cost, {target: query})."""
    rows, cols = len(cost), len(cost[0]) if cost else 0
    best = (math.inf, {})
    for chosen in itertools.permutations(range(rows), cols):
        total = sum(cost[q][j] for j, q in enumerate(chosen))
        if total < best[0]:
            best = (total, dict(enumerate(chosen)))
    return best if cols else (0.0, {})


def match_groups(logits, boxes, labels, targets, groups) -> dict[int, int]:
    """One image: {query: target} from brute-force assignment within each contiguous query block."""
    block = len(boxes) // groups
    matched = {}
    for g in range(groups):
        cost = [[pair_cost(logits[g * block + q], boxes[g * block + q], labels[j], targets[j])
                 for j in range(len(targets))] for q in range(block)]
        matched.update({g * block + q: j for j, q in brute_force_assign(cost)[1].items()})
    return matched


def ia_bce(logits: list[list[float]], matched: dict[int, tuple[int, float]], alpha: float = 0.25) -> float:
    """Σ over queries and classes; matched = {query: (label, IoU)}; not divided by num_boxes."""
    total = 0.0
    for q, row in enumerate(logits):
        for c, x in enumerate(row):
            p = sigmoid(x)
            if q in matched and matched[q][0] == c:
                t = max(p**alpha * matched[q][1] ** (1 - alpha), 0.01)
                total += -(t * math.log(p) + (1 - t) * math.log(1 - p))
            else:
                total += p**2 * math.log1p(math.exp(x))
    return total


def box_losses(pairs: list[tuple[list[float], list[float]]]) -> tuple[float, float]:
    """(Σ L1, Σ (1 − GIoU)) over matched (pred cxcywh, target cxcywh) pairs."""
    l1 = sum(abs(u - v) for pred, target in pairs for u, v in zip(pred, target))
    giou = sum(1 - iou_giou(xyxy(pred), xyxy(target))[1] for pred, target in pairs)
    return l1, giou
