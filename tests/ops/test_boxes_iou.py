"""Pairwise and matched-pair IoU / GIoU against a per-box loop and hand-computed values."""

import torch
import torchvision

from detrkit.ops.boxes import (box_area, box_iou, elementwise_box_iou, elementwise_generalized_box_iou,
                               generalized_box_iou)


def naive_iou_giou(a, b):
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    iou = inter / max(union, 1e-7)
    return iou, iou - (hull - union) / max(hull, 1e-7)


def random_xyxy(n, generator):
    corner = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    return torch.cat((corner, corner + torch.rand(n, 2, generator=generator, dtype=torch.float64)), dim=1)


def test_pairwise_matches_loop_twin_and_elementwise_diagonal():
    generator = torch.Generator().manual_seed(0)
    a, b = random_xyxy(5, generator), random_xyxy(7, generator)
    iou, giou = box_iou(a, b), generalized_box_iou(a, b)
    assert iou.shape == giou.shape == (5, 7)
    for i in range(5):
        for j in range(7):
            expected = naive_iou_giou(a[i].tolist(), b[j].tolist())
            assert abs(iou[i, j].item() - expected[0]) < 1e-12
            assert abs(giou[i, j].item() - expected[1]) < 1e-12
    torch.testing.assert_close(elementwise_box_iou(a, b[:5]), iou.diagonal())
    torch.testing.assert_close(elementwise_generalized_box_iou(a, b[:5]), giou.diagonal())


def test_agrees_with_torchvision_on_proper_boxes():
    generator = torch.Generator().manual_seed(1)
    a, b = random_xyxy(6, generator), random_xyxy(4, generator)
    torch.testing.assert_close(box_iou(a, b), torchvision.ops.box_iou(a, b))
    torch.testing.assert_close(generalized_box_iou(a, b), torchvision.ops.generalized_box_iou(a, b))


def test_hand_computed_values():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [4.0, 0.0, 5.0, 1.0]])
    # overlap 1, union 7, hull 9; disjoint: union 5, hull 10
    torch.testing.assert_close(box_iou(a, b), torch.tensor([[1 / 7, 0.0]]))
    torch.testing.assert_close(generalized_box_iou(a, b), torch.tensor([[1 / 7 - 2 / 9, -0.5]]))
    torch.testing.assert_close(box_area(b), torch.tensor([4.0, 1.0]))


def test_degenerate_boxes_stay_finite():
    point = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    assert box_iou(point, point).item() == 0.0
    assert generalized_box_iou(point, point).item() == 0.0
    line = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert torch.isfinite(generalized_box_iou(line, point)).all()


def test_union_below_eps_is_clamped_to_eps():
    a = torch.tensor([[0.1, 0.1, 0.1001, 0.1001]], dtype=torch.float64)  # area 1e-8
    b = torch.tensor([[0.1, 0.1, 0.10005, 0.1001]], dtype=torch.float64)  # inside a, area 0.5e-8
    # union 1e-8 < eps = 1e-7, so IoU = 0.5e-8 / 1e-7 (the reference gives 0.05 here too)
    expected = torch.tensor([[0.05]], dtype=torch.float64)
    torch.testing.assert_close(box_iou(a, b), expected)
    torch.testing.assert_close(generalized_box_iou(a, b), expected)  # enclosure = a, no penalty
