"""TrainConfig against spec 12.1: every field, its validation, paths, devices, unknown keywords, enums."""

import functools
import json
import warnings
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from detrkit.config import AugmentationBackend, ModelConfig, TrainConfig
from detrkit.variants import RFDETRNanoConfig

# spec 12.1 defaults of the fields issue 19 added (keypoint fields belong to the keypoint issue)
NEW_FIELD_DEFAULTS = {
    "eval_batch_size": None, "pad_targets_to": None, "pack_targets": True, "optimizer": "adamw",
    "optimizer_kwargs": {}, "lr_scheduler": "step", "lr_scheduler_kwargs": {}, "lr_scheduler_interval": "step",
    "lr_scheduler_monitor": "val/loss", "compute_val_loss": "auto", "compute_test_loss": True,
    "eval_ema_only": False, "fp16_eval": False, "dont_save_weights": False, "train_log_sync_dist": False,
    "train_log_on_step": False, "compact_train_metrics": True, "compute_train_metrics": False,
    "save_dataset_grids": False, "clearml": False, "eval_masks_head_resolution": False, "class_names": None,
    "notes": None, "skip_best_epochs": 0, "smooth_alpha": 0.0, "num_sanity_val_steps": 0, "pin_memory": None,
    "persistent_workers": None, "prefetch_factor": None,
}
SPEC_FIELDS = (
    "lr lr_encoder batch_size grad_accum_steps auto_batch_target_effective auto_batch_max_targets_per_image "
    "auto_batch_ema_headroom epochs resume ema_decay ema_tau checkpoint_interval warmup_epochs lr_vit_layer_decay "
    "lr_component_decay drop_path cls_loss_coef dataset_file square_resize_div_64 dataset_dir output_dir "
    "multi_scale expanded_scales use_ema ema_update_interval eval_base_model num_workers weight_decay amp_dtype "
    "best_model_metric early_stopping early_stopping_patience early_stopping_min_delta early_stopping_use_ema "
    "progress_bar tensorboard wandb mlflow project run run_test eval_max_dets eval_interval log_per_class_metrics "
    "eval_backend aug_config scale_jitter augmentation_backend accelerator clip_max_norm seed sync_bn strategy "
    "devices num_nodes").split()


def config(**kwargs) -> TrainConfig:
    return TrainConfig(**{"dataset_dir": None, **kwargs})


def test_every_spec_field_exists_with_its_default():
    fields = TrainConfig.model_fields
    assert not [name for name in SPEC_FIELDS + list(NEW_FIELD_DEFAULTS) if name not in fields]
    defaults = config()
    assert {name: getattr(defaults, name) for name in NEW_FIELD_DEFAULTS} == NEW_FIELD_DEFAULTS


@pytest.mark.parametrize("field", ["eval_batch_size", "pad_targets_to", "prefetch_factor"])
def test_optional_counts_are_at_least_one(field):
    assert getattr(config(**{field: 3}), field) == 3
    with pytest.raises(ValidationError, match=field):
        config(**{field: 0})


def test_path_fields_take_pathlib_paths_and_store_strings(tmp_path):
    train = config(dataset_dir=tmp_path / "data", output_dir=Path("~") / "out", resume=Path("runs/last.ckpt"))
    assert train.dataset_dir == str(tmp_path / "data") and isinstance(train.dataset_dir, str)
    assert train.output_dir == str(Path.home() / "out")
    assert train.resume == "runs/last.ckpt"  # passed on as given: "last" must stay "last"
    assert config(resume="last").resume == "last"
    for build in (ModelConfig, RFDETRNanoConfig):
        assert build(pretrain_weights=tmp_path / "w.pth").pretrain_weights == str(tmp_path / "w.pth")
    json.dumps(train.model_dump(mode="json"))


def test_unknown_keywords_name_themselves_suggest_spellings_and_stay_validation_errors():
    with pytest.raises(ValidationError) as caught:
        config(epoch=3)
    text = str(caught.value)
    assert "`epoch`" in text and "did you mean `epochs`" in text and "detrkit.config.TrainConfig" in text
    with pytest.raises(ValidationError, match="did you mean `resolution`.*detrkit.config.ModelConfig"):
        ModelConfig(resolutoin=640)
    with pytest.raises(ValidationError, match="detrkit.variants.RFDETRNanoConfig"):
        RFDETRNanoConfig(resolutoin=640)
    with pytest.raises(ValidationError, match="`zzqqxx`; see"):  # nothing close: no suggestion
        config(zzqqxx=1)
    train = config()
    with pytest.raises(ValidationError, match="did you mean `epochs`"):
        train.epochz = 3  # assignment too


def test_augmentation_backend_is_a_string_enum_with_aliases():
    assert [m.value for m in AugmentationBackend] == ["torchvision", "albumentations", "kornia", "cpu", "auto"]
    assert AugmentationBackend("gpu") is AugmentationBackend.GPU is AugmentationBackend.KORNIA
    assert AugmentationBackend("TV") is AugmentationBackend.TORCHVISION
    assert AugmentationBackend("albu") is AugmentationBackend.ALBUMENTATIONS
    train = config(augmentation_backend=AugmentationBackend.KORNIA)
    assert train.augmentation_backend == "kornia" and train.augmentation_backend is AugmentationBackend.KORNIA
    assert {"kornia": 1}[train.augmentation_backend] == 1 and str(train.augmentation_backend) == "kornia"
    assert config().augmentation_backend is AugmentationBackend.CPU
    assert config(augmentation_backend="gpu").model_dump(mode="json")["augmentation_backend"] == "kornia"
    with pytest.raises(ValidationError, match="'opencv' is none of torchvision, albumentations, kornia, cpu, auto"):
        config(augmentation_backend="opencv")


@pytest.mark.parametrize("owner", ["model", "train"])
def test_invalid_device_is_a_validation_error_naming_the_forms(owner):
    build = (lambda d: ModelConfig(device=d)) if owner == "model" else (lambda d: config(device=d))
    for bad in ("gpu", "cuda:x", "cuda0", "tpu"):
        with pytest.raises(ValidationError, match=rf"device='{bad}'.*'cpu', 'cuda', 'cuda:N' or 'mps'"):
            build(bad)
    for good, stored in (("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("mps", "mps"),
                         (torch.device("cuda", 0), "cuda:0")):
        assert build(good).device == stored
    assert config().device is None


def test_optimizer_names_paths_and_classes():
    assert config(optimizer="SGD").optimizer == "SGD" and config(optimizer=" adamw ").optimizer == "adamw"
    assert config(optimizer="torch.optim.SGD", optimizer_kwargs={"lr": 0.1}).optimizer_kwargs == {"lr": 0.1}
    partial = functools.partial(torch.optim.SGD, momentum=0.9)
    assert config(optimizer=partial).model_dump()["optimizer"] is partial  # in memory as given
    assert config(optimizer=partial).model_dump(mode="json")["optimizer"] == "torch.optim.sgd.SGD"
    lambdas = config(lr_scheduler="torch.optim.lr_scheduler.LambdaLR", lr_scheduler_kwargs={"lr_lambda": abs})
    assert json.loads(lambdas.model_dump_json())["lr_scheduler_kwargs"] == {"lr_lambda": "builtins.abs"}
    assert config(optimizer=torch.optim.RMSprop).optimizer is torch.optim.RMSprop
    with pytest.raises(ValidationError, match="optimizer='adamz' is not a torch.optim optimizer"):
        config(optimizer="adamz")
    for reserved in ("params", "lr", "weight_decay", "fused"):
        with pytest.raises(ValidationError, match=f"optimizer_kwargs cannot set \\['{reserved}'\\]"):
            config(optimizer="sgd", optimizer_kwargs={reserved: 1})


def test_scheduler_presets_paths_and_their_kwargs():
    assert config(lr_scheduler="Cosine").lr_scheduler == "cosine"
    assert config(lr_scheduler_kwargs={"lr_drop": 40, "min_factor": 0.1}).lr_scheduler_kwargs["lr_drop"] == 40
    with pytest.raises(ValidationError, match="accepts only lr_drop and min_factor, not \\['gamma'\\]"):
        config(lr_scheduler_kwargs={"gamma": 0.5})
    step = config(lr_scheduler="torch.optim.lr_scheduler.StepLR", lr_scheduler_kwargs={"step_size": 3, "gamma": 0.5})
    assert step.lr_scheduler_kwargs == {"step_size": 3, "gamma": 0.5}
    assert config(lr_scheduler=torch.optim.lr_scheduler.StepLR).model_dump(mode="json")["lr_scheduler"] == \
        "torch.optim.lr_scheduler.StepLR"
    with pytest.raises(ValidationError, match="lr_scheduler='plateau' is not 'step' or 'cosine'"):
        config(lr_scheduler="plateau")
    with pytest.raises(ValidationError, match="lr_scheduler_interval"):
        config(lr_scheduler_interval="batch")


def test_epoch_stepped_warmup_needs_two_epochs():
    explicit = dict(lr_scheduler="torch.optim.lr_scheduler.StepLR", lr_scheduler_interval="epoch")
    with pytest.raises(ValidationError, match="needs at least 2 epochs"):
        config(**explicit, warmup_epochs=1)
    with pytest.raises(ValidationError, match="needs at least 2 epochs"):
        config(**explicit, warmup_epochs=0.5)
    assert config(**explicit, warmup_epochs=1.5).warmup_epochs == 1.5  # two epoch steps
    assert config(**{**explicit, "lr_scheduler_interval": "step"}, warmup_epochs=0.5).warmup_epochs == 0.5
    assert config(lr_scheduler="step", lr_scheduler_interval="epoch", warmup_epochs=1).warmup_epochs == 1


def test_plateau_on_val_loss_needs_the_validation_loss():
    plateau = "torch.optim.lr_scheduler.ReduceLROnPlateau"
    for spec in (plateau, torch.optim.lr_scheduler.ReduceLROnPlateau,
                 functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=2)):
        with pytest.raises(ValidationError, match="compute_val_loss=False leaves ReduceLROnPlateau"):
            config(lr_scheduler=spec, compute_val_loss=False)
    assert config(lr_scheduler=plateau, compute_val_loss=False, lr_scheduler_monitor="train/loss")
    assert config(lr_scheduler=plateau).compute_val_loss == "auto"
    assert config(compute_val_loss=True).compute_val_loss is True
    with pytest.raises(ValidationError, match="compute_val_loss"):
        config(compute_val_loss="sometimes")


def test_deprecated_scheduler_keywords_fold_into_lr_scheduler_kwargs():
    with pytest.warns(FutureWarning, match="lr_drop and lr_min_factor"):
        train = config(lr_drop=30, lr_min_factor=0.05, lr_scheduler="cosine")
    assert train.lr_scheduler_kwargs == {"lr_drop": 30, "min_factor": 0.05}
    assert "lr_drop" not in train.model_dump()
    with pytest.warns(FutureWarning):
        assert config(lr_drop=30, lr_scheduler_kwargs={"lr_drop": 50}).lr_scheduler_kwargs == {"lr_drop": 50}


@pytest.mark.parametrize("flag", ["eval_ema_only", "fp16_eval"])
def test_deprecated_evaluation_flags_warn_and_do_nothing(flag):
    with pytest.warns(FutureWarning, match=f"{flag} is deprecated and has no effect"):
        assert getattr(config(**{flag: True}), flag) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config(**{flag: False})  # a saved config carries the default: silent


def test_eval_ema_only_needs_ema_and_contradicts_eval_base_model():
    with pytest.warns(FutureWarning), pytest.raises(ValidationError, match="eval_ema_only=True needs use_ema"):
        config(eval_ema_only=True, use_ema=False)
    with pytest.warns(FutureWarning), pytest.raises(ValidationError, match="contradicts eval_base_model"):
        config(eval_ema_only=True, eval_base_model=True)


def test_inert_and_accepted_fields():
    train = config(dont_save_weights=True, pack_targets=False, eval_masks_head_resolution=True, notes="run 7",
                   class_names=["a", "b"], train_log_sync_dist=True, num_sanity_val_steps=2)
    assert (train.dont_save_weights, train.pack_targets, train.eval_masks_head_resolution) == (True, False, True)
    assert train.notes == "run 7" and train.class_names == ["a", "b"] and train.num_sanity_val_steps == 2
