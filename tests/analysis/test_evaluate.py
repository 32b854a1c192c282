"""evaluate() gives exactly the numbers validation logged, and the per-class and sweep views agree with them."""

import csv

import numpy as np
import pytest

from detrkit.training.confidence_sweep import sweep_confidence


def last_validation(output):
    with open(output / "metrics.csv", newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get("val/mAP_50_95")]
    return rows[-1]


def test_evaluate_returns_validations_numbers(trained, shapes_dir):
    model, output = trained
    logged = last_validation(output)
    result = model.evaluate(shapes_dir, split="valid", batch_size=2, num_workers=0, plots=False,
                            output_dir=str(output / "eval"))
    assert result.metrics["mAP_50"] > 0 and result.metrics["F1"] > 0  # so that equality says something
    names = ["mAP_50_95", "mAP_50", "mAP_75", "mAR", "precision", "recall", "F1"]
    for name in names:  # metrics.csv holds the logged float32 values, printed in full
        assert np.float32(result.metrics[name]) == np.float32(float(logged[f"val/{name}"])), name
    assert result.map_50_95 == result.metrics["mAP_50_95"] and result.f1 == result.metrics["F1"]
    assert result.stats.images == 4 and len(result.detections) == 4


def test_result_views_agree(trained, shapes_dir):
    model, output = trained
    result = model.evaluate(shapes_dir, split="test", batch_size=1, num_workers=0, plots=False,
                            output_dir=str(output / "eval"))
    assert result.split == "test" and result.stats.images == 2
    sweep = sweep_confidence(result.detections, result.truth)
    assert result.best_threshold == sweep.best_threshold
    assert result.f1 == pytest.approx(sweep.best_f1)
    for row in result.per_class:  # each class's best point is the top of its own F1 curve
        if row.instances:
            k = list(sweep.classes).index(row.label)
            assert row.f1 == pytest.approx(sweep.per_class_f1[k].max())
            assert row.best_threshold == sweep.thresholds[int(np.argmax(sweep.per_class_f1[k]))]
    with_truth = [row.ap for row in result.per_class if row.instances]
    assert result.map_50_95 == pytest.approx(np.mean(with_truth), abs=1e-6)  # macro mAP over classes with truth
    assert sum(row.instances for row in result.per_class) == result.stats.instances


def test_train_split_is_unaugmented_and_deterministic(trained, shapes_dir):
    model, output = trained
    first = model.evaluate(shapes_dir, split="train", num_workers=0, plots=False, output_dir=str(output / "eval"))
    second = model.evaluate(shapes_dir, split="train", num_workers=0, plots=False, output_dir=str(output / "eval"))
    assert first.stats.images == 4 and first.metrics == second.metrics
