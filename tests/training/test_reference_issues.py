"""The reference's long-running bug classes as tests: resume keeps metrics rows and both tracks'
best scores; fewer queries keep their groups; another resolution resumes or fails before training;
accumulation windows are whole and a resume inside one repeats it; the sanity check never ranks."""

import csv
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from detrkit import RFDETRNano
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.models.weights import CheckpointError
from detrkit.training import checkpoints

FAST = {"batch_size": 2, "num_workers": 0, "progress_bar": None, "tensorboard": False, "seed": 0,
        "checkpoint_interval": 1}
QUERY_KEYS = ("refpoint_embed.weight", "query_feat.weight")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=7, num_valid=2,
                                  num_test=0, image_size=(96, 64), seed=0)


def fresh_model(tiny: dict, **overrides) -> RFDETRNano:
    torch.manual_seed(0)
    return RFDETRNano(**{**tiny, **overrides})


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def validation_rows(output: Path) -> dict[int, dict[str, str]]:
    with open(output / "metrics.csv", newline="") as stream:
        return {int(row["epoch"]): {k: v for k, v in row.items() if k.startswith("val/") and v}
                for row in csv.DictReader(stream) if row.get("val/mAP_50_95")}


def assert_equal_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


@pytest.fixture(scope="module")
def both_tracks(data, tmp_path_factory) -> Path:
    """Two epochs scoring the live and the EMA weights, uninterrupted."""
    from tiny_config import TINY

    output = tmp_path_factory.mktemp("both")
    fresh_model(TINY).train(dataset_dir=str(data), output_dir=str(output), epochs=2, eval_base_model=True,
                            **FAST)
    return output


def test_resume_keeps_metrics_rows_and_best_scores_of_both_tracks(data, both_tracks, tmp_path, tiny_kwargs):
    # reference #1325, #973: a resumed run lost its metrics rows and the best-score state
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=1, eval_base_model=True,
                                   **FAST)
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, resume="last",
                                    eval_base_model=True, **FAST)
    expected = validation_rows(both_tracks)
    assert sorted(expected) == [0, 1] and {"val/mAP_50_95", "val/ema_mAP_50_95"} <= set(expected[0])
    assert validation_rows(tmp_path) == expected  # every row, every value
    uninterrupted, resumed = load(both_tracks / "last.ckpt"), load(tmp_path / "last.ckpt")
    best = uninterrupted["callbacks"]["BestModels"]
    assert set(best["best"]) == {"regular", "ema"}
    assert resumed["callbacks"]["BestModels"] == {**best, "output_dir": str(tmp_path)}
    for name in ("checkpoint_best_regular.pth", "checkpoint_best_ema.pth", "checkpoint_best_total.pth"):
        a, b = load(both_tracks / name), load(tmp_path / name)
        assert a["epoch"] == b["epoch"], name
        assert_equal_weights(a["model"], b["model"])


def test_fewer_queries_fail_resume_clearly_and_fine_tune_group_by_group(data, both_tracks, tmp_path, tiny_kwargs):
    # reference #1019: fewer queries than the checkpoint mixed rows of different groups
    output = tmp_path / "never"
    with pytest.raises(CheckpointError, match=r"trained with 36 query rows \(num_queries=12 x group_detr=3\), "
                                              r"this model has 18: resume needs the same num_queries"):
        RFDETRNano(**{**tiny_kwargs, "num_queries": 6, "num_select": 6}).train(
            dataset_dir=str(data), output_dir=str(output), epochs=2, resume=str(both_tracks / "last.ckpt"), **FAST)
    assert not output.exists()  # failed before anything was written
    source = load(both_tracks / "last_ema.pth")["model"]
    tuned = RFDETRNano(**{**tiny_kwargs, "num_queries": 6, "num_select": 6,
                          "pretrain_weights": str(both_tracks / "last_ema.pth")})
    for key in QUERY_KEYS:  # each group keeps its own first 6 queries
        saved, loaded = source[key].view(3, 12, -1), tuned.model.state_dict()[key].view(3, 6, -1)
        assert torch.equal(loaded, saved[:, :6]), key
    tuned.train(dataset_dir=str(data), output_dir=str(tmp_path / "tuned"), epochs=1, **FAST)
    assert load(tmp_path / "tuned" / "last.ckpt")["model_config"]["num_queries"] == 6


def test_another_resolution_resumes_or_fails_before_training(data, both_tracks, tmp_path, tiny_kwargs):
    # reference #1002: resuming or fine-tuning at another resolution crashed deep inside training
    first = tmp_path / "res"
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(first), epochs=1, **FAST)
    RFDETRNano(**{**tiny_kwargs, "resolution": 96}).train(dataset_dir=str(data), output_dir=str(first), epochs=2,
                                                          resume="last", **FAST)
    resumed = load(first / "last.ckpt")
    assert resumed["epoch"] == 1 and resumed["model_config"]["resolution"] == 96
    assert all(torch.isfinite(v.float()).all() for v in resumed["state_dict"].values())
    output = tmp_path / "never"
    with pytest.raises(CheckpointError, match=r"trained with positional_encoding_size=4, this model has 8: resume "
                                              r"needs the same \(another resolution alone is fine\)"):
        RFDETRNano(**{**tiny_kwargs, "resolution": 128, "positional_encoding_size": 8}).train(
            dataset_dir=str(data), output_dir=str(output), epochs=2, resume=str(both_tracks / "last.ckpt"), **FAST)
    assert not output.exists()
    tuned = RFDETRNano(**{**tiny_kwargs, "resolution": 128, "positional_encoding_size": 8,
                          "pretrain_weights": str(both_tracks / "last_ema.pth")})
    tuned.train(dataset_dir=str(data), output_dir=str(tmp_path / "tuned"), epochs=1, **FAST)
    assert load(tmp_path / "tuned" / "last.ckpt")["model_config"]["resolution"] == 128


class Steps(pl.Callback):
    """Counts micro-batches and optimizer steps per epoch; raises at (epoch, batch) when asked."""

    def __init__(self, crash_at: tuple[int, int] | None = None) -> None:
        self.micro, self.steps, self.crash_at = {}, {}, crash_at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.micro[trainer.current_epoch] = self.micro.get(trainer.current_epoch, 0) + 1
        if (trainer.current_epoch, batch_idx) == self.crash_at:
            raise RuntimeError("crash")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.steps[trainer.current_epoch] = self.steps.get(trainer.current_epoch, 0) + 1


ACCUMULATED = {**FAST, "grad_accum_steps": 3}


def test_accumulation_windows_are_whole_and_a_resume_inside_one_repeats_it(data, tmp_path, tiny_kwargs):
    # reference #937: a partial window at the end of an epoch stepped with the wrong normaliser (or
    # not at all). The epoch is padded to whole windows (7 images, windows of 2 x 3 = 6 images),
    # so every window steps once, over its 3 micro-batches, as one batch of 6 images does.
    counted = Steps()
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "whole"), epochs=2,
                                   callbacks=[counted], **ACCUMULATED)
    assert counted.micro == {0: 15, 1: 15} and counted.steps == {0: 5, 1: 5}
    whole = load(tmp_path / "whole" / "last.ckpt")
    assert whole["global_step"] == 10 and whole["callbacks"]["EMA"]["updates"] == 10
    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="crash"):  # window [6, 7, 8] of epoch 1 two thirds done
        fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(crashed), epochs=2,
                                       callbacks=[Steps(crash_at=(1, 7))], **ACCUMULATED)
    assert load(crashed / "last.ckpt")["epoch"] == 0
    RFDETRNano(**tiny_kwargs).train(dataset_dir=str(data), output_dir=str(crashed), epochs=2, resume="last",
                                    **ACCUMULATED)
    resumed = load(crashed / "last.ckpt")
    assert resumed["global_step"] == whole["global_step"]
    assert_equal_weights(whole["state_dict"], resumed["state_dict"])
    assert_equal_weights(whole["callbacks"]["EMA"]["weights"], resumed["callbacks"]["EMA"]["weights"])


def test_sanity_check_never_ranks_and_skip_best_epochs_is_honoured(data, tmp_path, tiny_kwargs, monkeypatch):
    # reference #1348: the sanity-check validation was taken for the best epoch
    written: list[tuple[str, int]] = []
    real = checkpoints.save_atomically

    def recorded(payload, path):
        if Path(path).name.startswith("checkpoint_best_"):
            written.append((Path(path).name, payload["epoch"]))
        real(payload, path)

    monkeypatch.setattr(checkpoints, "save_atomically", recorded)
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "sanity"), epochs=1,
                                   num_sanity_val_steps=1, eval_base_model=True, **FAST)
    # the sanity check scored the untrained weights first; only epoch 0 was ranked
    assert sorted(written) == [("checkpoint_best_ema.pth", 0), ("checkpoint_best_regular.pth", 0),
                               ("checkpoint_best_total.pth", 0)]
    written.clear()
    fresh_model(tiny_kwargs).train(dataset_dir=str(data), output_dir=str(tmp_path / "skip"), epochs=3,
                                   num_sanity_val_steps=1, skip_best_epochs=2, eval_base_model=True, **FAST)
    assert all(epoch >= 2 for _, epoch in written) and {name for name, _ in written} == {
        "checkpoint_best_ema.pth", "checkpoint_best_regular.pth", "checkpoint_best_total.pth"}
    best = load(tmp_path / "skip" / "last.ckpt")["callbacks"]["BestModels"]["best"]
    assert best == pytest.approx({track: float(validation_rows(tmp_path / "skip")[2][name])
                                  for track, name in (("regular", "val/mAP_50_95"), ("ema", "val/ema_mAP_50_95"))})
