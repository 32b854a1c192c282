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


# Masks (spec 8.2, 8.3): images are lists of rows, points (x, y) in [0, 1] over the image.


def pixel_coordinate(t: float, size: int) -> float:
    """Point coordinate -> pixel coordinate, pixel centres at i + 0.5, clamped to the border."""
    return min(max(t * size - 0.5, 0.0), size - 1.0)


def bilinear_at(image: list[list[float]], x: float, y: float) -> float:
    height, width = len(image), len(image[0])
    px, py = pixel_coordinate(x, width), pixel_coordinate(y, height)
    x0, y0 = math.floor(px), math.floor(py)
    x1, y1 = min(x0 + 1, width - 1), min(y0 + 1, height - 1)
    fx, fy = px - x0, py - y0
    top = (1 - fx) * image[y0][x0] + fx * image[y0][x1]
    bottom = (1 - fx) * image[y1][x0] + fx * image[y1][x1]
    return (1 - fy) * top + fy * bottom


def nearest_at(image: list[list[float]], x: float, y: float) -> float:
    """The nearest pixel; exact halves round to even, as grid_sample's nearbyint does."""
    height, width = len(image), len(image[0])
    return image[round(pixel_coordinate(y, height))][round(pixel_coordinate(x, width))]


def factor_mask(spatial: list[list[list[float]]], query: list[float], bias: float) -> list[list[float]]:
    """Dense (h, w) logits of one query: spatial (D, h, w) . query (D) + bias, pixel by pixel."""
    height, width = len(spatial[0]), len(spatial[0][0])
    return [[sum(s[y][x] * q for s, q in zip(spatial, query)) + bias for x in range(width)] for y in range(height)]


def bce(x: float, t: float) -> float:
    """BCE with logits: −t·log σ(x) − (1−t)·log(1−σ(x)) = softplus(x) − t·x."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x))) - t * x


def dice(logits: list[float], labels: list[float]) -> float:
    prob = [sigmoid(x) for x in logits]
    return 1 - (2 * sum(p * t for p, t in zip(prob, labels)) + 1) / (sum(prob) + sum(labels) + 1)


def mask_pair_cost(logits: list[float], labels: list[float]) -> tuple[float, float]:
    """Matching costs of one query and one target at shared points: mean of BCE(x, 1)·t +
    BCE(x, 0)·(1 − t), and dice."""
    ce = sum(bce(x, 1.0) * t + bce(x, 0.0) * (1 - t) for x, t in zip(logits, labels)) / len(logits)
    return ce, dice(logits, labels)


def mask_pair_loss(mask: list[list[float]], target: list[list[float]], candidates: list[tuple[float, float]],
                   fresh: list[tuple[float, float]], num_points: int) -> tuple[float, float]:
    """Mean point BCE and dice of one matched pair: the int(0.75·P) candidates with the smallest
    |logit|, then the fresh points; labels from the nearest target pixel."""
    kept = sorted(candidates, key=lambda p: abs(bilinear_at(mask, *p)))[:int(0.75 * num_points)]
    points = kept + fresh
    logits = [bilinear_at(mask, *p) for p in points]
    labels = [nearest_at(target, *p) for p in points]
    return sum(bce(x, t) for x, t in zip(logits, labels)) / len(points), dice(logits, labels)


# Keypoints (spec 9): pred is K rows of [x, y, findable, visible, log_l11, l21, log_l22, class],
# target K rows of [x, y, v]; the first `active` rows count; area is the box's w·h.


def keypoint_pair_terms(pred: list[list[float]], target: list[list[float]], active: int,
                        area: float) -> tuple[float, float, float, float]:
    """Location L1, findable BCE, visible BCE and Gaussian NLL of one prediction and one target;
    as matching costs they are the same numbers."""
    located = [k for k in range(active) if target[k][2] > 0]
    l1 = sum(abs(pred[k][0] - target[k][0]) + abs(pred[k][1] - target[k][1]) for k in located)
    findable = sum(bce(pred[k][2], float(target[k][2] > 0)) for k in range(active)) / max(active, 1)
    visible = sum(bce(pred[k][3], float(target[k][2] > 1)) for k in range(active)) / max(active, 1)
    nll = 0.0
    for k in located:
        dx, dy = pred[k][0] - target[k][0], pred[k][1] - target[k][1]
        log_l11, l21, log_l22 = pred[k][4:7]
        u0, u1 = math.exp(log_l11) * dx + l21 * dy, math.exp(log_l22) * dy
        nll += 0.5 * (u0 * u0 + u1 * u1) / area - (log_l11 + log_l22)
    count = max(len(located), 1)
    return l1 / math.sqrt(area) / count, findable, visible, nll / count


def class_block(pred: list[list[float]], label: int, schema: list[int]) -> tuple[list[list[float]], int]:
    """The K rows of `label`'s block of one query's C·K rows and how many are active (0 beyond the schema)."""
    slots = max(schema)
    block = min(label, len(schema) - 1)
    return pred[block * slots:(block + 1) * slots], schema[label] if label < len(schema) else 0


def match_groups_by(cost, queries: int, targets: int, groups: int) -> dict[int, int]:
    """{query: target} from brute-force assignment within each contiguous query block; cost(q, j)."""
    block = queries // groups
    matched = {}
    for g in range(groups):
        table = [[cost(g * block + q, j) for j in range(targets)] for q in range(block)]
        matched.update({g * block + q: j for j, q in brute_force_assign(table)[1].items()})
    return matched
