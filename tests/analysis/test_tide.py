"""The TIDE breakdown against the `tidecv` package on a COCO-shaped state, and on hand-made cases."""

import numpy as np
import pytest
import torch

from detrkit.analysis.tide import ERROR_TYPES, tide_breakdown


def coco_shaped_state(seed: int, images: int = 40, classes: int = 4):
    """Ground truth of random boxes, and detections made from it with every kind of error."""
    rng = np.random.default_rng(seed)
    detections, truth = [], []
    for _ in range(images):
        count = int(rng.integers(0, 6))
        xy = rng.uniform(0, 400, (count, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(10, 120, (count, 2))], axis=1)
        labels = rng.integers(0, classes, count)
        crowd = np.zeros(count, dtype=bool)
        if count and rng.random() < 0.2:
            crowd[-1] = True
        pred_boxes, pred_labels = [], []
        for box, label in zip(boxes, labels):
            kind = rng.choice(["good", "good", "good", "cls", "loc", "both", "dupe", "miss"])
            if kind == "miss":
                continue
            size = box[2:] - box[:2]
            shift = size * (rng.uniform(0.3, 0.45, 2) if kind in ("loc", "both") else rng.uniform(0, 0.05, 2))
            moved = box + np.concatenate([shift, shift]) * rng.choice([-1, 1], 2).repeat(2)[[0, 2, 1, 3]]
            wrong = (label + 1 + rng.integers(0, classes - 1)) % classes
            pred_boxes.append(moved)
            pred_labels.append(wrong if kind in ("cls", "both") else label)
            if kind == "dupe":
                pred_boxes.append(box + rng.uniform(-2, 2, 4))
                pred_labels.append(label)
        for _ in range(int(rng.integers(0, 3))):  # background
            xy = rng.uniform(500, 700, 2)
            pred_boxes.append(np.concatenate([xy, xy + rng.uniform(5, 40, 2)]))
            pred_labels.append(int(rng.integers(0, classes)))
        scores = rng.permutation(len(pred_boxes)) / max(len(pred_boxes), 1) * 0.5 + rng.uniform(0.3, 0.5)
        detections.append({"boxes": torch.tensor(np.array(pred_boxes).reshape(-1, 4)),
                           "scores": torch.tensor(scores + rng.uniform(0, 1e-3, len(scores))),
                           "labels": torch.tensor(np.array(pred_labels, dtype=np.int64))})
        truth.append({"boxes": torch.tensor(boxes.reshape(-1, 4)), "labels": torch.tensor(labels),
                      "iscrowd": torch.tensor(crowd.astype(np.int64))})
    return detections, truth


def tidecv_breakdown(detections, truth):
    tidecv = pytest.importorskip("tidecv")
    for name, value in (("float", float), ("int", int), ("bool", bool)):  # removed numpy aliases tidecv may use
        if not hasattr(np, name):
            setattr(np, name, value)
    gt, preds = tidecv.Data("gt"), tidecv.Data("preds")
    for image, (detection, image_truth) in enumerate(zip(detections, truth)):
        gt.add_image(image, f"image {image}")
        for box, label, crowd in zip(image_truth["boxes"].tolist(), image_truth["labels"].tolist(),
                                     image_truth["iscrowd"].tolist()):
            xywh = [box[0], box[1], box[2] - box[0], box[3] - box[1]]
            if crowd:
                gt.add_ignore_region(image, label, xywh)
            else:
                gt.add_ground_truth(image, label, xywh)
        for box, label, score in zip(detection["boxes"].tolist(), detection["labels"].tolist(),
                                     detection["scores"].tolist()):
            preds.add_detection(image, label, score, [box[0], box[1], box[2] - box[0], box[3] - box[1]])
    tide = tidecv.TIDE()
    run = tide.evaluate(gt, preds, mode=tidecv.TIDE.BOX)
    main = run.fix_main_errors()
    special = run.fix_special_errors()
    counts = run.count_errors()
    names = {"Cls": "classification", "Loc": "localisation", "Both": "both", "Dupe": "duplicate",
             "Bkg": "background", "Miss": "missed"}
    delta = {names[kind.short_name]: value / 100 for kind, value in main.items()}
    count = {names[kind.short_name]: value for kind, value in counts.items()}
    fp, fn = (value / 100 for value in special.values())
    return run.ap / 100, delta, count, fp, fn


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_breakdown_matches_tidecv(seed):
    detections, truth = coco_shaped_state(seed)
    ours = tide_breakdown(detections, truth)
    ap, delta, counts, fp, fn = tidecv_breakdown(detections, truth)
    assert ours.ap == pytest.approx(ap, abs=1e-6)
    assert ours.counts == counts
    assert all(counts[kind] > 0 for kind in ERROR_TYPES)  # the state has every kind
    for kind in ERROR_TYPES:
        assert ours.delta[kind] == pytest.approx(delta[kind], abs=1e-6), kind
    assert ours.false_positive_delta == pytest.approx(fp, abs=1e-6)
    assert ours.false_negative_delta == pytest.approx(fn, abs=1e-6)
    assert sum(ours.errors_per_image) == sum(counts.values())


def test_hand_made_errors_are_named():
    """One box of each situation in its own image: the kinds and what fixing them gains."""
    box = torch.tensor([[0.0, 0.0, 100.0, 100.0]])
    truth = [{"boxes": box, "labels": torch.tensor([0])} for _ in range(4)]
    detections = [
        {"boxes": torch.cat([box, box]), "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([0, 0])},  # dupe
        {"boxes": box, "scores": torch.tensor([0.7]), "labels": torch.tensor([1])},  # classification
        {"boxes": torch.tensor([[0.0, 0.0, 100.0, 30.0]]), "scores": torch.tensor([0.6]), "labels": torch.tensor([0])},
        {"boxes": torch.tensor([[300.0, 300.0, 340.0, 340.0]]), "scores": torch.tensor([0.5]),
         "labels": torch.tensor([0])},  # background, and its box missed
    ]
    result = tide_breakdown(detections, truth)
    assert result.counts == {"classification": 1, "localisation": 1, "both": 0, "duplicate": 1,
                             "background": 1, "missed": 1}
    assert result.errors_per_image == [1, 1, 1, 2]
    assert result.delta["localisation"] > 0 and result.delta["classification"] > 0
