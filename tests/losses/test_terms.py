"""IA-BCE, L1 and GIoU terms against per-element loops; terms.py never waits for the device."""

import re
from pathlib import Path

import torch

from detrkit.losses import terms
from detrkit.losses.terms import giou_box_loss, ia_bce_loss, l1_box_loss
from twins import box_losses, ia_bce

BATCH, QUERIES, CLASSES = 2, 9, 4


def matched_case(seed):
    """Float64 logits (B, Q, C), flat matched queries, labels and IoUs (one in [0, 1], one 0)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(BATCH, QUERIES, CLASSES, generator=generator, dtype=torch.float64) * 3
    query = torch.tensor([0, 4, 8, 9, 13, 17])  # 3 groups x 1 target in image 0, x 1 in image 1
    labels = torch.randint(0, CLASSES, (6,), generator=generator)
    iou = torch.rand(6, generator=generator, dtype=torch.float64)
    iou[2] = 0.0  # the 0.01 floor
    return logits, query, labels, iou


def test_ia_bce_matches_loop_twin():
    for seed in range(3):
        logits, query, labels, iou = matched_case(seed)
        num_boxes = torch.tensor(6.0)
        loss = ia_bce_loss(logits, query, labels, iou, num_boxes)
        flat = logits.flatten(0, 1).tolist()
        matched = {q: (c, u) for q, c, u in zip(query.tolist(), labels.tolist(), iou.tolist())}
        assert abs(loss.item() - ia_bce(flat, matched) / 6.0) < 1e-12


def test_ia_bce_gradient_treats_the_soft_target_as_constant():
    logits, query, labels, iou = matched_case(5)
    logits.requires_grad_(True)
    ia_bce_loss(logits, query, labels, iou, torch.tensor(1.0)).backward()
    x = logits.detach().flatten(0, 1)
    p = x.sigmoid()
    # unmatched: d/dx σ²·softplus(x) = 2σ²(1 − σ)·softplus(x) + σ³
    expected = 2 * p**2 * (1 - p) * torch.nn.functional.softplus(x) + p**3
    t = (p[query, labels] ** 0.25 * iou**0.75).clamp(min=0.01)
    expected[query, labels] = p[query, labels] - t  # BCE towards a constant t
    torch.testing.assert_close(logits.grad.flatten(0, 1), expected)


def test_box_losses_match_loop_twin():
    generator = torch.Generator().manual_seed(1)
    pred = torch.rand(7, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.1
    target = torch.rand(7, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.1
    num_boxes = torch.tensor(3.0)
    l1, giou = box_losses(list(zip(pred.tolist(), target.tolist())))
    assert abs(l1_box_loss(pred, target, num_boxes).item() - l1 / 3) < 1e-12
    assert abs(giou_box_loss(pred, target, num_boxes).item() - giou / 3) < 1e-12


def test_no_matches_gives_zero_box_losses_that_still_backpropagate():
    boxes = torch.rand(2, 5, 4, requires_grad=True)
    empty = boxes.flatten(0, 1)[torch.zeros(0, dtype=torch.int64)]
    total = l1_box_loss(empty, torch.zeros(0, 4), torch.tensor(1.0)) + giou_box_loss(empty, torch.zeros(0, 4), torch.tensor(1.0))
    total.backward()
    assert total.item() == 0.0 and boxes.grad.eq(0).all()


def test_terms_never_move_to_the_host():
    source = Path(terms.__file__).read_text()
    assert not re.search(r"\.(item|cpu|tolist|numpy)\(", source)
