"""The rfdetr model-object API: from_checkpoint on every class, get_train_config, the callbacks
hook dictionary, COCO_CLASS_NAMES and resuming from a weights-only .pth."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import detrkit
from detrkit import RFDETR, RFDETRMedium, RFDETRNano, RFDETRSmall
from detrkit.config import TrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.variants import VARIANTS

FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=2,
                                  image_size=(64, 64), seed=0)


def save_weights_only(model: RFDETR, path: Path, **args) -> Path:
    """The published layout: weights under "model", training arguments as a Namespace, no optimizer."""
    torch.save({"model": model.model.state_dict(), "args": argparse.Namespace(**args)}, path)
    return path


def test_coco_class_names_are_the_80_names_in_category_id_order():
    names = detrkit.COCO_CLASS_NAMES
    assert len(names) == 80 == len(set(names))
    assert names == [detrkit.COCO_CATEGORIES[i] for i in sorted(detrkit.COCO_CATEGORIES)]
    assert (names[0], names[11], names[12], names[79]) == ("person", "stop sign", "parking meter", "toothbrush")


@pytest.mark.parametrize("cls", sorted(set(VARIANTS.values()), key=lambda c: c.__name__))
def test_from_checkpoint_is_a_classmethod_of_every_model_class(cls, tiny_kwargs, tmp_path):
    torch.manual_seed(0)
    source = RFDETRNano(**tiny_kwargs)
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": {"model." + k: v for k, v in source.model.state_dict().items()},
                "model_name": "RFDETRNano", "model_config": source.model_config.model_dump()}, path)
    model = cls.from_checkpoint(path, device="cpu")  # a Path is accepted too
    assert type(model) is RFDETRNano  # the class comes from the checkpoint, whichever class is asked
    for key, value in source.model.state_dict().items():
        assert torch.equal(model.model.state_dict()[key], value), key


def test_the_called_class_is_the_fallback_when_the_checkpoint_names_none(tiny_kwargs, tmp_path):
    source = RFDETRNano(**tiny_kwargs)
    path = save_weights_only(source, tmp_path / "fine_tuned.pth", **{k: v for k, v in tiny_kwargs.items()
                                                                     if k != "pretrain_weights"})
    assert type(RFDETRMedium.from_checkpoint(path, device="cpu")) is RFDETRMedium
    with pytest.warns(UserWarning, match="trust_checkpoint=True has no effect"):  # rfdetr's keyword, accepted
        detrkit.from_checkpoint(path, device="cpu", trust_checkpoint=True)
    assert type(detrkit.from_checkpoint(path, device="cpu")) is RFDETR


def test_get_train_config_validates_like_train(tiny_kwargs, tmp_path):
    model = RFDETRSmall(**tiny_kwargs)
    config = model.get_train_config(dataset_dir=str(tmp_path), epochs=7, lr=3e-4)
    assert isinstance(config, TrainConfig)
    assert (config.epochs, config.lr, config.dataset_dir) == (7, 3e-4, str(tmp_path.resolve()))
    with pytest.raises(ValidationError):
        model.get_train_config(dataset_dir=None, epochz=3)


def test_model_callbacks_is_rfdetrs_hook_dictionary(tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    assert model.callbacks["on_fit_epoch_end"] == []  # a defaultdict(list), as user code expects
    model.callbacks["on_train_end"].append(print)
    assert model.callbacks["on_train_end"] == [print]


def test_unknown_hook_events_fail_before_anything_is_written(tiny_kwargs, shapes, tmp_path):
    model = RFDETRNano(**tiny_kwargs)
    model.callbacks["on_epoch_end"].append(print)
    with pytest.raises(ValueError, match="on_epoch_end.*on_fit_epoch_end"):
        model.train(dataset_dir=str(shapes), output_dir=str(tmp_path / "out"), epochs=1, **FAST)
    assert not (tmp_path / "out").exists()


def test_user_hooks_are_called_with_rfdetrs_arguments_and_the_head_adapts(tiny_kwargs, shapes, tmp_path):
    """A model rebuilt by from_checkpoint with 5 classes fine-tunes on a 3-class set; the hooks see
    every batch, each epoch's numbers under rfdetr's names, and the end of training."""
    torch.manual_seed(0)
    path = save_weights_only(RFDETRNano(**tiny_kwargs), tmp_path / "rf-detr-nano.pth", num_classes=5,
                             **{k: v for k, v in tiny_kwargs.items() if k not in ("pretrain_weights", "num_classes")})
    model = RFDETRNano.from_checkpoint(path, device="cpu")
    assert model.model.num_classes == 5
    batches, epochs, ends = [], [], []
    model.callbacks["on_train_batch_start"].append(batches.append)
    model.callbacks["on_fit_epoch_end"].append(epochs.append)
    model.callbacks["on_train_end"].append(lambda: ends.append(True))
    model.train(dataset_dir=str(shapes), output_dir=str(tmp_path / "run"), epochs=2, **FAST)

    assert model.model.num_classes == 3 and model.class_names == ["circle", "square", "triangle"]
    steps_per_epoch = len(batches) // 2
    assert steps_per_epoch >= 2
    assert [b["epoch"] for b in batches] == [0] * steps_per_epoch + [1] * steps_per_epoch
    assert [b["step"] for b in batches] == list(range(2 * steps_per_epoch))
    assert all(b["model"] is model.model for b in batches)
    assert ends == [True]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for stats in epochs:
        assert stats["train_loss"] == stats["train/loss"] and math.isfinite(stats["train_loss"])
        assert stats["test_loss"] == stats["val/loss"] > 0  # computed for the hook (compute_val_loss="auto")
        coco = stats["test_coco_eval_bbox"]
        assert len(coco) == 12 and all(-1 <= value <= 1 for value in coco)
        assert coco[0] == pytest.approx(stats["val/mAP_50_95"]) and coco[1] == pytest.approx(stats["val/mAP_50"])
        assert coco[8] == pytest.approx(stats["val/mAR"])
        assert stats["n_parameters"] == sum(p.numel() for p in model.model.parameters() if p.requires_grad)
        assert "ema_test_coco_eval_bbox" not in stats  # only the EMA is scored by default


def test_resume_from_weights_without_optimizer_state_warns_and_continues(tiny_kwargs, shapes, tmp_path):
    torch.manual_seed(0)
    source = RFDETRNano(**{**tiny_kwargs, "num_classes": 3})
    path = save_weights_only(source, tmp_path / "weights.pth", num_classes=3)
    seen = {}

    import pytorch_lightning as pl

    class FirstStep(pl.Callback):
        def on_train_start(self, trainer, module):
            seen["epoch"] = trainer.current_epoch
            seen["weights"] = {k: v.clone() for k, v in module.model.state_dict().items()}

    model = RFDETRNano(**{**tiny_kwargs, "num_classes": 3})
    with pytest.warns(UserWarning, match="optimizer and LR scheduler start cold"):
        model.train(dataset_dir=str(shapes), output_dir=str(tmp_path / "run"), epochs=1, resume=str(path),
                    callbacks=[FirstStep()], **FAST)
    assert seen["epoch"] == 0
    for key, value in source.model.state_dict().items():
        assert torch.equal(seen["weights"][key], value), key
