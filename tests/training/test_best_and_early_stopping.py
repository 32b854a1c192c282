"""Best-weight tracking, early stopping and the validation tracks, on tiny runs and unit cases."""

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from detrkit import RFDETRNano
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training.callbacks.early_stopping import MetricEarlyStopping
from detrkit.training.checkpoints import BestModels

FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=2,
                                  num_test=2, image_size=(96, 64), seed=0)


def columns(output: Path) -> set[str]:
    with open(output / "metrics.csv", newline="") as stream:
        return set(next(csv.DictReader(stream)))


def test_ema_only_validation_mirrors_onto_the_main_keys(data, tmp_path, tiny_kwargs):
    output = tmp_path / "out"
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1, **FAST)
    with open(output / "metrics.csv", newline="") as stream:
        row = next(r for r in csv.DictReader(stream) if r.get("val/mAP_50_95"))
    for name in ("mAP_50_95", "mAP_50", "mAR", "F1"):
        assert row[f"val/{name}"] == row[f"val/ema_{name}"]
    assert not (output / "checkpoint_best_regular.pth").exists()


def test_eval_base_model_scores_both_and_keeps_both_best_files(data, tmp_path, tiny_kwargs):
    output = tmp_path / "out"
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1,
                                    eval_base_model=True, **FAST)
    assert {"val/mAP_50_95", "val/ema_mAP_50_95"} <= columns(output)
    for name in ("checkpoint_best_regular.pth", "checkpoint_best_ema.pth", "checkpoint_best_total.pth"):
        assert (output / name).exists(), name
    regular = torch.load(output / "checkpoint_best_regular.pth", weights_only=True)
    ema = torch.load(output / "checkpoint_best_ema.pth", weights_only=True)
    assert any(not torch.equal(regular["model"][k], ema["model"][k]) for k in regular["model"])


def test_without_ema_the_regular_weights_are_the_best(data, tmp_path, tiny_kwargs):
    output = tmp_path / "out"
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(data), output_dir=str(output), epochs=1, use_ema=False, **FAST)
    assert not any(name.startswith("val/ema_") for name in columns(output))
    assert not (output / "last_ema.pth").exists() and not (output / "checkpoint_best_ema.pth").exists()
    total = torch.load(output / "checkpoint_best_total.pth", weights_only=True)
    assert total["best_total_source"] == "regular"
    for key, value in model.model.state_dict().items():  # one epoch: the best are the final weights
        assert torch.equal(total["model"][key], value), key


def test_early_stopping_stops_and_reports_each_epoch(data, tmp_path, tiny_kwargs, caplog):
    output = tmp_path / "out"
    with caplog.at_level("INFO"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=6, early_stopping=True,
                                        early_stopping_patience=2, early_stopping_min_delta=2.0, **FAST)
    lines = [r.getMessage() for r in caplog.records if "- counter: " in r.getMessage()]
    # min_delta 2 on a metric in [0, 1]: nothing after the first epoch counts as an improvement
    assert lines[0].startswith("epoch 1/6: max(val/mAP_50_95, val/ema_mAP_50_95) = ")
    assert lines[0].endswith("- counter: 0")
    assert lines[1].endswith("- counter: 1 (no improvement)")
    assert lines[2].endswith("- counter: 2 → STOP")
    assert len(lines) == 3
    with open(output / "metrics.csv", newline="") as stream:
        assert max(int(r["epoch"]) for r in csv.DictReader(stream)) == 2


def fake_trainer(metrics: dict[str, float], epoch: int = 0):
    return SimpleNamespace(callback_metrics={k: torch.tensor(v) for k, v in metrics.items()}, current_epoch=epoch,
                           sanity_checking=False, state=SimpleNamespace(fn="fit"), is_global_zero=False)


def test_early_stopping_monitors_the_better_track_or_the_ema_alone():
    both = MetricEarlyStopping("mAP_50_95")
    label, value = both.monitored(fake_trainer({"val/mAP_50_95": 0.3, "val/ema_mAP_50_95": 0.4}))
    assert label == "max(val/mAP_50_95, val/ema_mAP_50_95)" and value.item() == pytest.approx(0.4)
    ema_only = MetricEarlyStopping("mAR", use_ema=True)
    label, value = ema_only.monitored(fake_trainer({"val/mAR": 0.9, "val/ema_mAR": 0.2}))
    assert label == "val/ema_mAR" and value.item() == pytest.approx(0.2)
    assert ema_only.monitored(fake_trainer({})) is None


def test_best_models_smooths_skips_and_picks_the_strictly_better_track(tmp_path):
    best = BestModels(tmp_path, metric="map", skip_epochs=1, smooth_alpha=0.5)
    saved = []
    best._save = lambda trainer, module, track: saved.append((trainer.current_epoch, track))
    module = SimpleNamespace(evaluates_base_model=True, ema=object())
    scores = [(0.9, 0.9), (0.2, 0.4), (0.6, 0.3), (0.1, 0.35)]  # (regular, ema) per epoch
    for epoch, (regular, ema) in enumerate(scores):
        trainer = fake_trainer({"val/mAP_50_95": regular, "val/ema_mAP_50_95": ema}, epoch)
        best.on_validation_end(trainer, module)
    # epoch 0 is skipped; smoothed regular 0.2, 0.4, 0.25; smoothed ema 0.4, 0.35, 0.35
    assert saved == [(1, "regular"), (1, "ema"), (2, "regular")]
    assert best.best == pytest.approx({"regular": 0.4, "ema": 0.4})
    assert best.best_total_source() == "regular"  # a tie does not go to the EMA
    best.best["ema"] = 0.41
    assert best.best_total_source() == "ema"


def test_per_class_ap_is_logged_by_class_name(data, tmp_path, tiny_kwargs):
    output = tmp_path / "out"
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(output), epochs=1,
                                    log_per_class_metrics=True, eval_backend="hotcoco", **FAST)
    with open(data / "valid" / "_annotations.coco.json") as stream:
        import json

        present = {c["name"] for c in json.load(stream)["categories"]} - {"shapes"}
    logged = {name.split("/")[-1] for name in columns(output) if name.startswith("val/AP/")}
    assert logged and logged <= present
    assert {f"val/ema_AP/{name}" for name in logged} <= columns(output)
