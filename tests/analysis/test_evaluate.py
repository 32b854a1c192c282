"""evaluate() gives exactly the numbers validation logged, and the per-class and sweep views agree with them."""

import csv

import numpy as np
import pytest
import torch

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


def test_plots_after_training_reuse_the_last_validation(shapes_dir, tmp_path, monkeypatch, fitting):
    """train() draws its evaluation plots from the last validation's own detections (no second
    pass over the validation set), and they equal a fresh evaluate() of the final weights."""
    from tiny_config import TINY

    from detrkit import RFDETRNano
    from detrkit.analysis import evaluate as evaluate_module
    from detrkit.analysis import report

    fresh_passes, drawn = [], []
    evaluate_detector, write_plots = evaluate_module.evaluate_detector, report.write_plots
    monkeypatch.setattr(evaluate_module, "evaluate_detector",
                        lambda *args, **kwargs: fresh_passes.append(args) or evaluate_detector(*args, **kwargs))
    monkeypatch.setattr(report, "write_plots",
                        lambda result, folder, *args: drawn.append(result) or write_plots(result, folder, *args))
    torch.manual_seed(0)
    model = RFDETRNano(**TINY)
    fit_to_validation, fast = fitting
    fit_to_validation(model, shapes_dir, steps=30)
    model.train(dataset_dir=str(shapes_dir), output_dir=str(tmp_path), **fast)
    assert fresh_passes == [] and len(drawn) == 1
    assert (tmp_path / "plots" / "gallery.png").is_file()
    after_training = drawn[0]
    fresh = model.evaluate(shapes_dir, num_workers=0, plots=False, output_dir=str(tmp_path / "eval"))
    assert after_training.metrics["mAP_50"] > 0
    assert after_training.metrics == fresh.metrics
    assert after_training.image_paths == fresh.image_paths
    for kept, again in zip(after_training.detections, fresh.detections, strict=True):
        assert torch.equal(kept["labels"], again["labels"])
        torch.testing.assert_close(kept["boxes"], again["boxes"])
