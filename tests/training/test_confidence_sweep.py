"""The confidence sweep against a twin that re-matches every threshold one detection at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detrkit.training.confidence_sweep import DEFAULT_THRESHOLDS, greedy_matches, sweep_confidence, sweep_matches


def _iou(a, b):
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def slow_sweep(preds, targets, thresholds, iou_threshold=0.5):
    """Per threshold, image and class: keep scores >= threshold, match greedily, count."""
    classes = sorted({int(label) for target in targets for label, crowd in
                      zip(target["labels"], target.get("iscrowd", torch.zeros(len(target["labels"])))) if not crowd})
    curves = {name: np.zeros((len(classes), len(thresholds))) for name in ("precision", "recall", "f1")}
    for column, threshold in enumerate(thresholds):
        tp, det, gt = dict.fromkeys(classes, 0), dict.fromkeys(classes, 0), dict.fromkeys(classes, 0)
        for pred, target in zip(preds, targets):
            crowd = target.get("iscrowd", torch.zeros(len(target["labels"]))).tolist()
            gts = [(int(l), b) for l, b, c in zip(target["labels"], target["boxes"].double().tolist(), crowd) if not c]
            for label, _ in gts:
                gt[label] += 1
            kept = [(float(s), k) for k, s in enumerate(pred["scores"].double().tolist()) if float(s) >= threshold]
            kept.sort(key=lambda item: -item[0])  # stable: ties keep their order
            taken = set()
            for _, k in kept:
                label, box = int(pred["labels"][k]), pred["boxes"][k].double().tolist()
                if label in det:
                    det[label] += 1
                best, best_iou = None, -1.0
                for g, (gt_label, gt_box) in enumerate(gts):
                    iou = _iou(box, gt_box)
                    if gt_label == label and g not in taken and iou >= iou_threshold and iou > best_iou:
                        best, best_iou = g, iou
                if best is not None:
                    taken.add(best)
                    tp[label] += 1
        for row, label in enumerate(classes):
            precision = tp[label] / det[label] if det[label] else 0.0
            recall = tp[label] / gt[label]
            curves["precision"][row, column] = precision
            curves["recall"][row, column] = recall
            curves["f1"][row, column] = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return classes, curves


def random_images(seed, images=12, classes=4):
    generator = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for index in range(images):
        num_gt = int(torch.randint(0, 6, (1,), generator=generator)) if index % 5 else 0
        corner = torch.rand(num_gt, 2, generator=generator) * 50
        gt_boxes = torch.cat([corner, corner + 5 + torch.rand(num_gt, 2, generator=generator) * 20], 1)
        gt_labels = torch.randint(0, classes, (num_gt,), generator=generator)
        source = torch.randint(0, max(num_gt, 1), (10,), generator=generator)
        boxes = gt_boxes[source] + torch.randn(10, 4, generator=generator) * 3 if num_gt else torch.rand(10, 4) * 50
        boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)
        labels = gt_labels[source] if num_gt else torch.randint(0, classes + 1, (10,), generator=generator)
        labels = torch.where(torch.rand(10, generator=generator) < 0.2, torch.randint(0, classes + 1, (10,), generator=generator), labels)
        scores = torch.floor(torch.rand(10, generator=generator) * 20) / 20  # ties, and scores on thresholds
        preds.append({"boxes": boxes, "scores": scores, "labels": labels})
        targets.append({"boxes": gt_boxes, "labels": gt_labels, "iscrowd": (torch.rand(num_gt, generator=generator) < 0.1).long()})
    return preds, targets


@pytest.mark.parametrize("seed", range(4))
def test_sweep_matches_the_per_threshold_twin(seed):
    preds, targets = random_images(seed)
    sweep = sweep_confidence(preds, targets)
    classes, curves = slow_sweep(preds, targets, DEFAULT_THRESHOLDS)
    assert sweep.classes.tolist() == classes
    np.testing.assert_allclose(sweep.per_class_precision, curves["precision"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(sweep.per_class_recall, curves["recall"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(sweep.per_class_f1, curves["f1"], rtol=0, atol=1e-12)
    macro_f1 = curves["f1"].mean(0)
    best = int(np.argmax(macro_f1))
    assert sweep.best_f1 == pytest.approx(macro_f1[best], abs=1e-12)
    assert sweep.best_precision == pytest.approx(curves["precision"].mean(0)[best], abs=1e-12)
    assert sweep.best_recall == pytest.approx(curves["recall"].mean(0)[best], abs=1e-12)
    assert sweep.best_threshold == DEFAULT_THRESHOLDS[best]
    assert 0 < sweep.best_f1 < 1


def test_hand_made_images():
    target = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]]), "labels": torch.tensor([1, 1, 2])}
    pred = {
        "boxes": torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30], [70, 70, 80, 80]]),
        "scores": torch.tensor([0.9, 0.8, 0.3, 0.95]),
        "labels": torch.tensor([1, 1, 1, 2]),
    }
    sweep = sweep_confidence([pred], [target])
    # above 0.3 and up to 0.8: class 1 finds one of two with one duplicate, class 2 is a miss
    column = 50
    assert sweep.per_class_precision[:, column].tolist() == [0.5, 0.0]
    assert sweep.per_class_recall[:, column].tolist() == [0.5, 0.0]
    # at 0.3 and below, class 1 finds both: P 2/3, R 1, F1 0.8 -> macro F1 0.4, the best
    assert sweep.best_threshold == 0.0 and sweep.best_f1 == pytest.approx(0.4)
    assert sweep.best_precision == pytest.approx(1 / 3) and sweep.best_recall == pytest.approx(0.5)


def test_crowds_and_images_without_anything():
    target = {"boxes": torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]]), "labels": torch.tensor([1, 3]),
              "iscrowd": torch.tensor([0, 1])}
    pred = {"boxes": torch.tensor([[0.0, 0, 10, 10]]), "scores": torch.tensor([0.5]), "labels": torch.tensor([1])}
    empty_pred = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
    empty_target = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)}
    sweep = sweep_confidence([pred, empty_pred], [target, empty_target])
    assert sweep.classes.tolist() == [1]  # the crowd's class has no ground truth to find
    assert sweep.best_f1 == 1.0 and sweep.best_threshold == 0.0
    nothing = sweep_confidence([empty_pred], [empty_target])
    assert nothing.best_f1 == 0.0 and nothing.f1.shape == (101,)


def test_one_matching_serves_every_threshold():
    preds, targets = random_images(7)
    matches = greedy_matches(preds, targets)
    assert len(matches.scores) == sum(len(p["scores"]) for p in preds)
    coarse = sweep_matches(matches, np.array([0.0, 0.5, 1.0]))
    fine = sweep_confidence(preds, targets)
    np.testing.assert_array_equal(coarse.f1, fine.f1[[0, 50, 100]])


def test_score_ties_are_matched_in_the_given_order():
    target = {"boxes": torch.tensor([[0.0, 0, 10, 10], [4, 0, 14, 10]]), "labels": torch.tensor([0, 0])}
    only_first, both = [0.0, 0, 10, 10], [1.0, 0, 11, 10]  # IoUs (1, 0.43) and (0.82, 0.54)

    def recall(boxes):
        pred = {"boxes": torch.tensor(boxes), "scores": torch.tensor([0.5, 0.5]), "labels": torch.tensor([0, 0])}
        return sweep_confidence([pred], [target]).best_recall

    assert recall([only_first, both]) == 1.0
    assert recall([both, only_first]) == 0.5
