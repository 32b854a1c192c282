"""Tests that from_checkpoint rebuilds the saved model class and config with its weights (spec 17)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

import detrkit
from detrkit import (
    RFDETR, RFDETRLarge, RFDETRMedium, RFDETRNano, RFDETRSeg2XLarge, RFDETRSegLarge, RFDETRSegMedium, RFDETRSegNano,
    RFDETRSegSmall, RFDETRSegXLarge, RFDETRSmall, from_checkpoint,
)
from detrkit.config import default_device
from detrkit.models.weights import Checkpoint
from detrkit.variants import model_class_for

NAMES = ["cat", "dog", "fox", "owl", "eel"]


def tiny(cls: type[RFDETR], kwargs: dict, seed: int = 0, **changes) -> RFDETR:
    """A tiny model with every parameter nudged, so loaded weights are told from fresh ones."""
    torch.manual_seed(seed)
    model = cls(**{**kwargs, **changes})
    with torch.no_grad():
        for param in model.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def outputs(model: RFDETR) -> tuple[torch.Tensor, torch.Tensor]:
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model.model(pixels)
    return out["pred_logits"], out.pred_boxes


def save_trained(model: RFDETR, path: Path, **extra) -> Path:
    """The layout train() writes: prefixed state dict, model_name, model_config, args."""
    state = {"model." + k: v for k, v in model.model.state_dict().items()}
    torch.save({"state_dict": state, "model_name": type(model).__name__,
                "model_config": model.model_config.model_dump(),
                "args": {"lr": 1e-4, "epochs": 3, "class_names": NAMES}, **extra}, path)
    return path


def save_published(model: RFDETR, path: Path, **args) -> Path:
    torch.save({"model": model.model.state_dict(), "args": argparse.Namespace(**args)}, path)
    return path


def rebuild(path: Path, **overrides) -> RFDETR:
    torch.manual_seed(123)  # a different initialisation than the saved model's
    return from_checkpoint(str(path), device="cpu", **overrides)


def assert_same_outputs(got: RFDETR, want: RFDETR) -> None:
    for a, b in zip(outputs(got), outputs(want)):
        assert torch.equal(a, b)


# -- rebuilding ------------------------------------------------------------------------------


def test_is_exported_at_the_top_level():
    assert detrkit.from_checkpoint is from_checkpoint


@pytest.mark.parametrize("cls", [RFDETRNano, RFDETRSmall, RFDETRLarge])
def test_trained_checkpoint_rebuilds_its_class_config_and_outputs(tiny_kwargs, tmp_path, cls):
    source = tiny(cls, tiny_kwargs)
    path = save_trained(source, tmp_path / "checkpoint_best_total.pth")
    model = rebuild(path)
    assert type(model) is cls
    saved, rebuilt = source.model_config.model_dump(), model.model_config.model_dump()
    assert rebuilt.pop("pretrain_weights") == str(path)
    saved.pop("pretrain_weights")
    assert rebuilt == saved
    assert model.class_names == NAMES
    assert_same_outputs(model, source)


def test_published_checkpoint_uses_args_and_the_weights_name(tiny_kwargs, tmp_path):
    source = tiny(RFDETRSmall, tiny_kwargs)
    fields = {k: v for k, v in tiny_kwargs.items() if k not in ("pretrain_weights", "device")}
    path = save_published(source, tmp_path / "weights.pth", pretrain_weights="rf-detr-small.pth",
                          class_names=NAMES, **fields)
    model = rebuild(path)
    assert type(model) is RFDETRSmall
    assert model.model_config.dec_layers == 2  # from args, not the Small preset's 3
    assert model.model_config.hidden_dim == 32
    assert_same_outputs(model, source)


def test_device_and_weights_of_the_saved_config_are_not_reused(tiny_kwargs, tmp_path):
    source = tiny(RFDETRNano, tiny_kwargs)
    path = tmp_path / "w.pth"
    config = dict(source.model_config.model_dump(), device="meta", pretrain_weights="/elsewhere/x.pth")
    torch.save({"model": source.model.state_dict(), "model_name": "RFDETRNano", "model_config": config}, path)
    model = from_checkpoint(str(path))
    assert model.model_config.device == default_device()
    assert model.model_config.pretrain_weights == str(path)
    assert torch.equal(model.model.class_embed.weight.cpu(), source.model.class_embed.weight)


def test_training_arguments_that_are_not_model_fields_are_ignored(tiny_kwargs, tmp_path):
    source = tiny(RFDETRNano, tiny_kwargs)
    fields = {k: v for k, v in tiny_kwargs.items() if k not in ("pretrain_weights", "device")}
    path = save_published(source, tmp_path / "nano.pth", lr=1e-4, batch_size=4, dataset_dir="/data",
                          **fields)
    assert_same_outputs(rebuild(path), source)


@pytest.mark.parametrize("saved_classes, written", [(3, 5), (8, 5), (5, None)])
def test_num_classes_comes_from_the_class_head_rows(tiny_kwargs, tmp_path, saved_classes, written):
    source = tiny(RFDETRNano, tiny_kwargs, num_classes=saved_classes)
    config = source.model_config.model_dump()
    if written is None:
        del config["num_classes"]
    else:
        config["num_classes"] = written
    path = tmp_path / "w.pth"
    torch.save({"model": source.model.state_dict(), "model_name": "RFDETRNano", "model_config": config}, path)
    model = rebuild(path)
    assert model.model.num_classes == saved_classes == model.model_config.num_classes
    assert_same_outputs(model, source)


def test_overrides_apply_the_fine_tuning_rules(tiny_kwargs, tmp_path):
    source = tiny(RFDETRNano, tiny_kwargs)
    path = save_trained(source, tmp_path / "last.ckpt")
    model = rebuild(path, num_classes=2, num_select=6)
    assert model.model_config.num_select == 6
    assert model.model.num_classes == 2
    torch.testing.assert_close(model.model.class_embed.weight, source.model.class_embed.weight[:3],
                               rtol=0, atol=0)


def test_missing_file_names_it(tmp_path):
    path = tmp_path / "missing.pth"
    with pytest.raises(FileNotFoundError, match=str(path)):
        from_checkpoint(str(path))


@pytest.mark.parametrize("extra", [{}, {"args": {}}, {"args": argparse.Namespace()}, {"model_config": {}}],
                         ids=["nothing", "empty-dict", "empty-namespace", "empty-config"])
def test_weights_without_config_or_args_raise_value_error(tiny_kwargs, tmp_path, extra):
    path = tmp_path / "bare.pth"
    torch.save({"model": tiny(RFDETRNano, tiny_kwargs).model.state_dict(), **extra}, path)
    with pytest.raises(ValueError, match=str(path)):
        from_checkpoint(str(path))


# -- choosing the class ----------------------------------------------------------------------


def checkpoint(model_name: str | None = None, pretrain_weights: str | None = None) -> Checkpoint:
    args = {"pretrain_weights": pretrain_weights} if pretrain_weights else {}
    return Checkpoint(Path("unused.pth"), {"class_embed.bias": torch.zeros(6)}, args, {}, model_name)


@pytest.mark.parametrize("model_name, weights, file_name, expected", [
    ("RFDETRMedium", "rf-detr-nano.pth", "small.pth", RFDETRMedium),
    ("RFDETRLarge", None, "x.pth", RFDETRLarge),
    (None, "rf-detr-small.pth", "rf-detr-nano-finetune.pth", RFDETRSmall),
    (None, "/cache/RF-DETR-MEDIUM.PTH", "x.pth", RFDETRMedium),
    (None, "rf-detr-large-2026.pth", "x.pth", RFDETRLarge),
    (None, None, "my-nano-run.ckpt", RFDETRNano),
    (None, None, "Large_best.pth", RFDETRLarge),
    ("RFDETRXLarge", None, "run-small.pth", RFDETRSmall),  # unknown class names fall through
    ("RFDETRSegNano", None, "run-small.pth", RFDETRSegNano),
    (None, "rf-detr-seg-nano.pt", "x.pth", RFDETRSegNano),  # not Nano: "seg-nano" contains "nano"
    (None, "rf-detr-seg-small.pt", "x.pth", RFDETRSegSmall),
    (None, "rf-detr-seg-medium.pt", "x.pth", RFDETRSegMedium),
    (None, "rf-detr-seg-large.pt", "x.pth", RFDETRSegLarge),
    (None, "rf-detr-seg-xlarge.pt", "x.pth", RFDETRSegXLarge),  # not SegLarge nor Large
    (None, "rf-detr-seg-xxlarge.pt", "x.pth", RFDETRSeg2XLarge),  # the published 2XLarge file name
    (None, None, "my-seg-2xlarge-run.pth", RFDETRSeg2XLarge),
    (None, None, "rf-detr-seg-nano.pt", RFDETRSegNano),
    (None, "rf-detr-nano.pth", "seg-small-copy.pth", RFDETRNano),  # the weights' name before the file's
    (None, "custom.pth", "checkpoint_best_total.pth", RFDETR),
    (None, None, "checkpoint.pth", RFDETR),
])
def test_model_class_is_resolved_from_name_then_weights_then_file(model_name, weights, file_name, expected):
    assert model_class_for(checkpoint(model_name, weights), Path("/runs") / file_name) is expected


def test_segmentation_checkpoint_rebuilds_its_class_and_masks(tiny_kwargs, tmp_path):
    source = tiny(RFDETRSegNano, tiny_kwargs, patch_size=16, num_windows=2)
    model = rebuild(save_trained(source, tmp_path / "checkpoint_best_total.pth"))
    assert type(model) is RFDETRSegNano and model.model_config.segmentation_head
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model.model(pixels).pred_masks, source.model(pixels).pred_masks)


def test_file_name_hint_builds_that_variant(tiny_kwargs, tmp_path):
    source = tiny(RFDETRMedium, tiny_kwargs)
    fields = {k: v for k, v in tiny_kwargs.items() if k not in ("pretrain_weights", "device")}
    path = save_published(source, tmp_path / "medium-finetuned.pth", **fields)
    model = rebuild(path)
    assert type(model) is RFDETRMedium
    assert_same_outputs(model, source)


def test_unknown_variant_builds_the_generic_class(tiny_kwargs, tmp_path):
    source = tiny(RFDETRNano, tiny_kwargs)
    fields = {k: v for k, v in tiny_kwargs.items() if k not in ("pretrain_weights", "device")}
    path = save_published(source, tmp_path / "checkpoint.pth", **fields)
    model = rebuild(path)
    assert type(model) is RFDETR
    assert_same_outputs(model, source)
