"""TrainConfig: the settings of one training run (spec 12.1); read only by builders."""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_serializer, field_validator, model_validator

from detrkit.config.base import DeviceStr, PathStr, StrictConfig
from detrkit.config.model import AmpDtype

# the COCO evaluators behind OnePassCocoMeanAveragePrecision; keys of detrkit.training.coco_map._BACKENDS
CocoEvalBackend = Literal["vernier", "hotcoco", "ufcoco", "faster_coco_eval"]
MultiScale = Literal["off", "per-batch", "per-sample"]
DatasetFormat = Literal["roboflow", "coco", "yolo"]


class AugmentationBackend(str, Enum):
    """CPU, ALBUMENTATIONS: Albumentations per sample in the loader workers; KORNIA: per batch on the device;
    AUTO: Kornia with CUDA, else Albumentations; TORCHVISION: the default pipeline. Members equal their strings."""

    TORCHVISION, ALBUMENTATIONS, KORNIA, CPU, AUTO = "torchvision", "albumentations", "kornia", "cpu", "auto"
    GPU, TV, ALBU = "kornia", "torchvision", "albumentations"  # aliases

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> AugmentationBackend | None:  # any case, and the aliases
        return cls.__members__.get(value.strip().upper()) if isinstance(value, str) else None


MANAGED_SCHEDULES = ("step", "cosine")  # warm-up and length sized by detrkit (spec 12.3)
MANAGED_SCHEDULE_KWARGS = {"lr_drop": 100, "min_factor": 0.0}  # all they accept, and the defaults
MANAGED_OPTIMIZER_KWARGS = ("params", "lr", "weight_decay", "fused")  # set by detrkit for torch.optim names


def native_optimizer(name: str) -> type[torch.optim.Optimizer] | None:
    """The torch.optim optimizer called `name` in any case ("adamw", "SGD"), or None."""
    classes = {key.lower(): value for key, value in vars(torch.optim).items()
               if isinstance(value, type) and issubclass(value, torch.optim.Optimizer)}
    return classes.get(name.strip().lower())


def is_plateau_scheduler(spec: object) -> bool:
    """Whether an lr_scheduler setting names ReduceLROnPlateau (or a subclass of it)."""
    target = spec.func if isinstance(spec, functools.partial) else spec
    named = isinstance(target, str) and target.rsplit(".", 1)[-1] == "ReduceLROnPlateau"
    return named or isinstance(target, type) and issubclass(target, torch.optim.lr_scheduler.ReduceLROnPlateau)


class TrainConfig(StrictConfig):
    """Settings of one training run (spec section 12.1); unknown keys raise ValidationError."""

    legacy_keys: ClassVar[frozenset[str]] = frozenset({"lr_drop", "lr_min_factor"})

    dataset_dir: PathStr | None
    output_dir: PathStr = Field("output", validate_default=True)
    dataset_file: DatasetFormat | None = None  # None: detected from the folder layout
    class_names: list[str] | None = None
    epochs: int = Field(100, ge=1)
    batch_size: int | Literal["auto"] = 4  # "auto": the largest that fits on the GPU (spec 16.5)
    grad_accum_steps: int = Field(1, ge=1)
    auto_batch_target_effective: int = Field(16, ge=1)  # batch_size="auto": images per optimizer step
    auto_batch_max_targets_per_image: int = Field(100, ge=1)  # boxes per image in the memory probe
    auto_batch_ema_headroom: float = Field(0.7, gt=0, le=1)  # probed batch scaled by this when use_ema
    eval_batch_size: int | None = Field(None, ge=1)  # val/test loaders; None: batch_size
    pad_targets_to: int | None = Field(None, ge=1)  # fixed target rows per image (XLA); not implemented
    pack_targets: bool = True
    lr: float = Field(1e-4, gt=0)
    lr_encoder: float = Field(1.5e-4, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    warmup_epochs: float = Field(0.0, ge=0)
    lr_vit_layer_decay: float = Field(0.8, gt=0)
    lr_component_decay: float = Field(0.7, gt=0)
    # a torch.optim name in any case ("adamw", "sgd"), a dotted import path, or a class; given the param groups
    optimizer: str | Callable[..., Any] = "adamw"
    optimizer_kwargs: dict[str, Any] = {}
    # "step"/"cosine" (spec 12.3), or a dotted path, class or functools.partial: f(optimizer, **lr_scheduler_kwargs)
    lr_scheduler: str | Callable[..., Any] = "step"
    lr_scheduler_kwargs: dict[str, Any] = {}
    lr_scheduler_interval: Literal["step", "epoch"] = "step"  # explicit schedulers only
    lr_scheduler_monitor: str = "val/loss"  # ReduceLROnPlateau only
    drop_path: float = Field(0.0, ge=0, lt=1)
    clip_max_norm: float = Field(0.1, ge=0)
    cls_loss_coef: float = Field(1.0, ge=0)
    # keypoint models (spec 9): loss weights (0 off), flat left/right index pairs, OKS sigmas for evaluation
    keypoint_l1_loss_coef: float = Field(0.0, ge=0)
    keypoint_findable_loss_coef: float = Field(0.0, ge=0)
    keypoint_visible_loss_coef: float = Field(0.0, ge=0)
    keypoint_nll_loss_coef: float = Field(0.0, ge=0)
    keypoint_flip_pairs: list[int] = []
    keypoint_oks_sigmas: list[float] | None = None
    multi_scale: MultiScale = "per-batch"
    expanded_scales: bool = True
    square_resize_div_64: bool = True
    scale_jitter: bool = True
    aug_config: dict[str, dict] | None = None  # None: default pipeline; {}: no augmentation
    augmentation_backend: AugmentationBackend = AugmentationBackend.CPU
    save_dataset_grids: bool = False  # first train and valid batches drawn to output_dir/dataset_grids/
    mosaic: float = Field(0.0, ge=0, le=1)  # probability that a training sample is a 2x2 mosaic
    mixup: float = Field(0.0, ge=0, le=1)  # probability that a training sample is blended with another
    close_mosaic_epochs: int = Field(0, ge=0)  # the last epochs train without mosaic and mixup
    skip_bad_images: bool = False  # leave out missing, corrupt or wrongly sized images (with a warning), not fail
    num_workers: int | None = Field(None, ge=0)  # None: 2, or on CUDA one per CPU core up to 8
    pin_memory: bool | None = None  # None: on CUDA
    persistent_workers: bool | None = None  # None: when there are workers
    prefetch_factor: int | None = Field(None, ge=1)  # None: 2
    eval_interval: int = Field(1, ge=1)
    eval_max_dets: int = Field(500, ge=1)
    eval_backend: CocoEvalBackend = "vernier"
    eval_masks_head_resolution: bool = False  # segmentation models only
    eval_ema_only: bool = False  # deprecated, no effect: validation scores the EMA weights by default
    fp16_eval: bool = False  # deprecated, no effect: evaluation follows amp_dtype
    compute_val_loss: Literal["auto"] | bool = "auto"  # "auto": when a scheduler or callback monitors val/loss
    compute_test_loss: bool = True
    compute_train_metrics: bool = False  # train/mAP_*: box mAP of the training batches as trained on
    log_per_class_metrics: bool = False
    run_test: bool = False
    evaluation_plots: bool = True  # after fit: evaluate() on the validation split, PNGs in output_dir/plots/
    train_batch_plots: bool = True  # at fit start: the first two augmented batches, plots/train_batch<i>.png
    resume: PathStr | None = None  # a full checkpoint (last.ckpt, checkpoint_<epoch>.ckpt) or a .pth
    use_ema: bool = True
    ema_decay: float = Field(0.993, ge=0, lt=1)
    ema_tau: float = Field(100, gt=0)
    ema_update_interval: int = Field(1, ge=1)
    eval_base_model: bool = False
    checkpoint_interval: int = Field(10, ge=1)
    dont_save_weights: bool = False  # True: no full-state last.ckpt / checkpoint_<epoch>.ckpt; best .pth files only
    best_model_metric: Literal["map", "mar"] = "map"
    skip_best_epochs: int = Field(0, ge=0)
    smooth_alpha: float = Field(0.0, ge=0, lt=1)
    early_stopping: bool = False
    early_stopping_patience: int = Field(10, ge=1)
    early_stopping_min_delta: float = Field(0.001, ge=0)
    early_stopping_use_ema: bool = False
    notes: str | None = None
    seed: int | None = None
    progress_bar: Literal["tqdm", "rich"] | None = "tqdm"
    tensorboard: bool = True
    wandb: bool = False
    mlflow: bool = False
    clearml: bool = False  # not supported: True raises NotImplementedError when the loggers are built
    project: str | None = None
    run: str | None = None
    train_log_sync_dist: bool = False  # train/* logs reduced over processes
    train_log_on_step: bool = False  # train/* logged every step too (per term only without compaction)
    compact_train_metrics: bool = True  # auxiliary and encoder terms summed into train/<term>_aux
    accelerator: str = "auto"
    devices: int | str | list[int] = 1
    strategy: str = "auto"
    sync_bn: bool = False
    num_nodes: int = Field(1, ge=1)
    device: DeviceStr | None = None  # overrides the model's device for training
    amp_dtype: AmpDtype = "auto"  # None means "fp32"; an unknown name warns and means "auto"
    fp8_backend: Literal["auto", "transformer-engine", "torchao"] = "auto"  # amp_dtype="fp8": "auto" is TE if importable
    num_sanity_val_steps: int = Field(0, ge=0)
    # a NaN or infinite training loss raises NonFiniteLossError; up to this many such steps are skipped instead
    skip_nonfinite_steps: int = Field(0, ge=0)

    @classmethod
    def _upgrade(cls, data: dict[str, Any]) -> dict[str, Any]:
        legacy = {key: data.pop(key) for key in ("lr_drop", "lr_min_factor") if key in data}
        if legacy:
            warnings.warn(f"deprecated keyword {' and '.join(legacy)}: pass lr_scheduler_kwargs="
                          f"{{'lr_drop': ..., 'min_factor': ...}} instead", FutureWarning, stacklevel=4)
            renamed = {"min_factor" if key == "lr_min_factor" else key: value for key, value in legacy.items()}
            data["lr_scheduler_kwargs"] = {**renamed, **(data.get("lr_scheduler_kwargs") or {})}
        for flag, why in (("eval_ema_only", "validation scores the EMA weights (eval_base_model adds the live ones)"),
                          ("fp16_eval", "evaluation runs at the precision amp_dtype resolves to")):
            if data.get(flag):
                warnings.warn(f"{flag} is deprecated and has no effect: {why}", FutureWarning, stacklevel=4)
        return data

    @field_validator("multi_scale", mode="before")
    @classmethod
    def _bool_aliases(cls, value: object) -> object:
        return {True: "per-batch", False: "off"}[value] if isinstance(value, bool) else value

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: object) -> object:
        if isinstance(value, bool) or (isinstance(value, int) and value < 1):
            raise ValueError(f"batch_size must be a positive integer or 'auto', got {value!r}")
        return value

    @field_validator("amp_dtype", mode="before")
    @classmethod
    def _amp_dtype(cls, value: object) -> object:
        known = AmpDtype.__args__
        if value is None:
            return "fp32"
        if isinstance(value, str) and value.strip().lower() in known:
            return value.strip().lower()
        warnings.warn(f"amp_dtype={value!r} is not one of {list(known)}; using 'auto'", UserWarning, stacklevel=2)
        return "auto"

    @field_validator("augmentation_backend", mode="before")
    @classmethod
    def _backend(cls, value: object) -> object:
        try:
            return AugmentationBackend(value)
        except ValueError:
            names = ", ".join(name.lower() for name in AugmentationBackend.__members__)
            raise ValueError(f"{value!r} is none of {names}") from None

    @field_validator("progress_bar", mode="before")
    @classmethod
    def _legacy_progress(cls, value: object) -> object:
        return {True: "tqdm", False: None}[value] if isinstance(value, bool) else value

    @field_validator("optimizer", "lr_scheduler")
    @classmethod
    def _short_names(cls, value: str | Callable[..., Any], info: ValidationInfo) -> str | Callable[..., Any]:
        """Bare names must be torch.optim optimizers or the managed schedules; dotted paths import at build."""
        if not isinstance(value, str) or "." in value:
            return value.strip() if isinstance(value, str) else value
        if info.field_name == "lr_scheduler" and value.strip().lower() in MANAGED_SCHEDULES:
            return value.strip().lower()
        if info.field_name == "optimizer" and native_optimizer(value) is not None:
            return value.strip()
        known = "'step' or 'cosine'" if info.field_name == "lr_scheduler" else "a torch.optim optimizer ('adamw', ...)"
        raise ValueError(f"{info.field_name}={value!r} is not {known}; give a dotted import path "
                         f"('package.module.Class') or the class itself")

    @field_validator("dataset_dir", "output_dir")
    @classmethod
    def _realpath(cls, value: str | None) -> str | None:
        return None if value is None else os.path.realpath(os.path.expanduser(value))

    @field_validator("strategy")
    @classmethod
    def _data_parallel_only(cls, value: str) -> str:
        if value in ("auto", "single_device") or value.startswith("ddp"):
            return value
        raise ValueError(f"strategy={value!r} is not supported for detection training: detrkit runs on one "
                         f"device or on Lightning's DDP ('ddp', 'ddp_spawn', 'ddp_find_unused_parameters_true'); "
                         f"sharded strategies such as FSDP and DeepSpeed are not validated with it")

    @field_serializer("optimizer", "lr_scheduler", "optimizer_kwargs", "lr_scheduler_kwargs", when_used="json")
    def _callables_as_paths(self, value: Any) -> Any:  # in JSON a functools.partial loses its kwargs
        if isinstance(value, dict):
            return {key: self._callables_as_paths(item) for key, item in value.items()}
        target = value.func if isinstance(value, functools.partial) else value
        return f"{target.__module__}.{target.__qualname__}" if callable(value) else value

    @model_validator(mode="after")
    def _ema_settings(self) -> TrainConfig:
        if self.early_stopping_use_ema and not self.use_ema:
            raise ValueError("early_stopping_use_ema=True needs use_ema=True")
        if self.eval_ema_only and (not self.use_ema or self.eval_base_model):
            raise ValueError("eval_ema_only=True needs use_ema=True and contradicts eval_base_model=True")
        if self.amp_dtype == "fp8" and self.batch_size == "auto":
            raise ValueError("amp_dtype='fp8' needs an explicit integer batch_size: the batch_size='auto' probe "
                             "does not exercise FP8 layers")
        return self

    @model_validator(mode="after")
    def _optimisation(self) -> TrainConfig:
        reserved = sorted(set(MANAGED_OPTIMIZER_KWARGS) & set(self.optimizer_kwargs))
        if isinstance(self.optimizer, str) and "." not in self.optimizer and reserved:
            raise ValueError(f"optimizer_kwargs cannot set {reserved}: detrkit passes them to {self.optimizer!r} "
                             f"(use the lr / weight_decay fields)")
        unknown = sorted(set(self.lr_scheduler_kwargs) - set(MANAGED_SCHEDULE_KWARGS))
        managed = isinstance(self.lr_scheduler, str) and self.lr_scheduler in MANAGED_SCHEDULES
        if managed and unknown:
            raise ValueError(f"lr_scheduler_kwargs of lr_scheduler={self.lr_scheduler!r} accepts only lr_drop and "
                             f"min_factor, not {unknown}")
        plateau = is_plateau_scheduler(self.lr_scheduler)
        if (not managed and not plateau and self.lr_scheduler_interval == "epoch"
                and 0 < math.ceil(self.warmup_epochs) < 2):
            raise ValueError(f"warmup_epochs={self.warmup_epochs} with lr_scheduler_interval='epoch' cannot ramp: "
                             f"an epoch-stepped warm-up needs at least 2 epochs (or use lr_scheduler_interval='step')")
        if plateau and self.compute_val_loss is False and self.lr_scheduler_monitor == "val/loss":
            raise ValueError("compute_val_loss=False leaves ReduceLROnPlateau without its monitor 'val/loss': set "
                             "compute_val_loss=True or 'auto', or another lr_scheduler_monitor")
        return self


class SegmentationTrainConfig(TrainConfig):
    """TrainConfig of the RFDETRSeg models: adds the mask loss weights (also the matcher's mask costs)."""

    mask_point_sample_ratio: int = Field(16, ge=1)  # mask losses sample max(h, h*w // ratio) points
    mask_ce_loss_coef: float = Field(5.0, ge=0)
    mask_dice_loss_coef: float = Field(5.0, ge=0)


class KeypointTrainConfig(TrainConfig):
    """TrainConfig of RFDETRKeypointPreview: keypoint losses on, ranking starts after 10 epochs, smoothed."""

    cls_loss_coef: float = Field(2.0, ge=0)
    keypoint_l1_loss_coef: float = Field(1.0, ge=0)
    keypoint_findable_loss_coef: float = Field(1.0, ge=0)
    keypoint_visible_loss_coef: float = Field(1.0, ge=0)
    keypoint_nll_loss_coef: float = Field(1.0, ge=0)
    smooth_alpha: float = Field(0.5, ge=0, lt=1)
    skip_best_epochs: int = Field(10, ge=0)
