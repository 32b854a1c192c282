"""build_trainer: a Lightning Trainer with the loggers, callbacks and settings a run asks for."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pydantic import ValidationError
from pydantic_core import PydanticCustomError
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities import rank_zero_info

from detrkit.config import (KeypointTrainConfig, ModelConfig, SegmentationTrainConfig, TrainConfig,
                            unknown_keyword_message)
from detrkit.training.accel.cuda_graphs import CudaGraphStepMarker
from detrkit.training.accel.fp8 import FP8_BACKENDS
from detrkit.training.accel.plan import AccelerationPlan, log_plan, plan_acceleration, read_device_facts
from detrkit.training.accel.precision import (
    Accelerators,
    TensorFloat32,
    resolve_precision,
    selected_accelerators,
)
from detrkit.training.callbacks.early_stopping import MetricEarlyStopping
from detrkit.training.callbacks.heap import RetainHeap
from detrkit.training.callbacks.progress import EpochRichProgressBar, EpochTQDMProgressBar, RunClock
from detrkit.training.callbacks.schedule import ValidateLastEpoch
from detrkit.training.callbacks.start_report import StartReport
from detrkit.training.callbacks.summary import EpochSummary
from detrkit.training.checkpoints import AtomicCheckpointIO, BestModels, FileCheckpoint, metric_key
from detrkit.training.ema import EMACallback
from detrkit.training.epoch_csv import EpochCSVLogger
from detrkit.training.manual_step import require_data_parallel, trains_manually
from detrkit.training.run_record import TrainingConfigRecord

logger = logging.getLogger(__name__)


def build_trainer(train_config: TrainConfig, plan: AccelerationPlan | None = None, **trainer_kwargs: Any) -> pl.Trainer:
    """Trainer for `train_config`; keyword arguments override or extend the Trainer's settings
    (devices defaults to 1; callbacks and loggers given here are added to detrkit's). `plan` (from
    `plan_run`) carries the precision, FP8 and CUDA-graph decisions that need the model config;
    without one the precision is resolved from amp_dtype alone (FP8 needs a plan)."""
    output = Path(train_config.output_dir)
    manual = trains_manually(train_config)  # keypoint models clip and accumulate themselves (manual_step.py)
    if manual:
        require_data_parallel(trainer_kwargs.get("strategy", train_config.strategy))
    topology, accelerators = _placement(train_config)
    callbacks = [RetainHeap(), TensorFloat32(), ValidateLastEpoch(), RunClock(), StartReport(), EpochSummary(),
                 *run_callbacks(train_config),
                 *trainer_kwargs.pop("callbacks", [])]
    if plan is not None and plan.cuda_graphs == "inductor":
        callbacks.append(CudaGraphStepMarker())
    # each refresh reads the step's loss back from the device: on a GPU that stalls the queue of
    # work, so the bar refreshes every 10 steps there
    refresh = 1 if accelerators.kind == "cpu" else 10
    if train_config.progress_bar == "rich":
        callbacks.append(EpochRichProgressBar(refresh_rate=refresh))
    elif train_config.progress_bar == "tqdm":
        callbacks.append(EpochTQDMProgressBar(refresh_rate=refresh))
    settings: dict[str, Any] = dict(
        default_root_dir=str(output), max_epochs=train_config.epochs, accelerator=_accelerator(train_config),
        **topology, strategy=train_config.strategy,
        **_precision(train_config, accelerators, plan, trainer_kwargs.get("precision")),
        gradient_clip_val=None if manual else train_config.clip_max_norm or None,
        gradient_clip_algorithm=None if manual else "norm",
        accumulate_grad_batches=1 if manual else train_config.grad_accum_steps,
        sync_batchnorm=train_config.sync_bn,
        check_val_every_n_epoch=train_config.eval_interval, num_sanity_val_steps=train_config.num_sanity_val_steps,
        enable_checkpointing=True, enable_progress_bar=train_config.progress_bar is not None,
        enable_model_summary=False, log_every_n_steps=10,
        use_distributed_sampler=False,  # RFDETRDataModule shards the data itself
        logger=[*build_loggers(train_config), *_as_list(trainer_kwargs.pop("logger", []))],
        callbacks=callbacks)
    settings["plugins"] = [AtomicCheckpointIO(), *settings.get("plugins", []),
                           *_as_list(trainer_kwargs.pop("plugins", []))]
    settings.update(trainer_kwargs)
    return pl.Trainer(**settings)


def plan_run(model_config: ModelConfig, train_config: TrainConfig, trainer_kwargs: dict[str, Any]) -> AccelerationPlan:
    """Compile, CUDA graphs, FP8 and precision for this run, decided once from the configs and
    this machine; fallbacks are logged, contradictions raise before anything is written."""
    topology, accelerators = _placement(train_config)
    facts = read_device_facts(train_config, accelerators, devices=topology["devices"],
                              num_nodes=topology["num_nodes"], precision=trainer_kwargs.get("precision"),
                              accumulate_grad_batches=trainer_kwargs.get("accumulate_grad_batches"))
    plan = plan_acceleration(model_config, train_config, facts)
    log_plan(plan)
    return plan


def launched_topology(devices: int | str | list[int], num_nodes: int) -> dict[str, Any]:
    """Under torchrun, `devices="auto"` means the processes it started on this node, and the
    default num_nodes=1 follows its node count, so the same script runs on one node or many."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    if "TORCHELASTIC_RUN_ID" not in os.environ or local is None or world is None:
        return {"devices": devices, "num_nodes": num_nodes}
    local_size, world_size = int(local), int(world)
    if devices == "auto":
        devices = local_size
    if num_nodes == 1 and world_size > local_size:
        num_nodes = world_size // local_size
    return {"devices": devices, "num_nodes": num_nodes}


def run_callbacks(train_config: TrainConfig) -> list[pl.Callback]:
    """EMA, best-weights tracking, full checkpoints and early stopping, as the config asks."""
    output = train_config.output_dir
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    # validation metrics are computed once from all processes' images and broadcast: already in sync
    warnings.filterwarnings("ignore", message=".*when logging on epoch level in distributed setting")
    callbacks: list[pl.Callback] = [TrainingConfigRecord()]  # Ctrl-C: the module's GracefulInterrupt
    if train_config.use_ema:
        callbacks.append(EMACallback(train_config.ema_decay, train_config.ema_tau, train_config.ema_update_interval))
    # mask and keypoint models train with their own configs, and are ranked by their task's metric
    segmentation = isinstance(train_config, SegmentationTrainConfig)
    keypoints = isinstance(train_config, KeypointTrainConfig)
    callbacks.append(BestModels(output, train_config.best_model_metric, train_config.skip_best_epochs,
                                train_config.smooth_alpha, segmentation, keypoints))
    if not train_config.dont_save_weights:  # the full-state files; without them, resume from a .pth
        callbacks.append(FileCheckpoint(dirpath=output, filename="last", save_top_k=1, every_n_epochs=1,
                                         enable_version_counter=False, save_on_train_epoch_end=True))
        callbacks.append(FileCheckpoint(dirpath=output, filename="checkpoint_{epoch}", auto_insert_metric_name=False,
                                         save_top_k=-1, every_n_epochs=train_config.checkpoint_interval,
                                         save_on_train_epoch_end=True))
    if train_config.early_stopping:
        callbacks.append(MetricEarlyStopping(
            metric_key(train_config.best_model_metric, segmentation, keypoints), patience=train_config.early_stopping_patience,
            min_delta=train_config.early_stopping_min_delta, use_ema=train_config.early_stopping_use_ema,
            skip_epochs=train_config.skip_best_epochs))
    return callbacks


def split_train_kwargs(kwargs: dict[str, Any], config_class: type[TrainConfig] = TrainConfig,
                       ) -> tuple[TrainConfig, dict[str, Any]]:
    """`config_class` from its fields; Lightning Trainer arguments that are not fields pass through.

    Anything that is neither raises pydantic's ValidationError naming it and the closest names of both.
    """
    trainer_params = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    config_keys = set(config_class.model_fields) | config_class.legacy_keys
    unknown = [k for k in kwargs if k not in config_keys and k not in trainer_params]
    if unknown:
        message = unknown_keyword_message(unknown, config_keys | trainer_params,
                                          f"detrkit.config.{config_class.__name__} and pytorch_lightning.Trainer")
        raise ValidationError.from_exception_data(config_class.__name__, [
            {"type": PydanticCustomError("unknown_keyword", message), "loc": (), "input": kwargs}])
    passthrough = {k: v for k, v in kwargs.items() if k not in config_keys}
    fields = {k: v for k, v in kwargs.items() if k not in passthrough}
    return config_class(**fields), passthrough


def _placement(train_config: TrainConfig) -> tuple[dict[str, Any], Accelerators]:
    """Lightning's devices and num_nodes (after torchrun) and the accelerators they select."""
    topology = launched_topology(train_config.devices, train_config.num_nodes)
    return topology, selected_accelerators(_accelerator(train_config), topology["devices"])


def _precision(train_config: TrainConfig, accelerators: Accelerators, plan: AccelerationPlan | None,
               given: Any) -> dict[str, Any]:
    """The Trainer's precision arguments for amp_dtype on these devices, logged once: `precision=`,
    or an FP8 backend's plugin. A `precision=` Trainer argument wins (and is logged as given)."""
    if given is not None:
        rank_zero_info(f"precision: {given} (set by the precision= Trainer argument) on {accelerators.describe()}")
        return {"precision": given}
    if plan is not None and plan.fp8_backend is not None:
        rank_zero_info(f"precision: fp8 through {plan.fp8_backend} on {accelerators.describe()}")
        return FP8_BACKENDS[plan.fp8_backend].trainer_precision()
    if plan is not None:  # resolved when the run was planned
        rank_zero_info(f"precision: {plan.precision} on {accelerators.describe()}")
        return {"precision": plan.precision}
    if train_config.amp_dtype == "fp8" and accelerators.kind == "cuda":
        raise ValueError("amp_dtype='fp8' is planned with the model (its layers are converted): train with "
                         "RFDETR.train(), or pass plan=plan_run(model_config, train_config, {}) to build_trainer")
    resolved = resolve_precision(train_config.amp_dtype, accelerators)
    rank_zero_info(resolved.describe())
    return {"precision": resolved.lightning}


def _accelerator(train_config: TrainConfig) -> str:
    if train_config.device is None:
        return train_config.accelerator
    kind = train_config.device.split(":")[0]
    return {"cuda": "gpu"}.get(kind, kind)


def _as_list(value: Any) -> list:
    if value is None or value is False:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def build_loggers(train_config: TrainConfig) -> list[Logger]:
    """metrics.csv (one row per epoch) always; TensorBoard when installed; W&B and MLflow when asked for."""
    output = train_config.output_dir
    loggers: list[Logger] = [EpochCSVLogger(output)]
    if train_config.tensorboard:
        if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
            from pytorch_lightning.loggers import TensorBoardLogger

            loggers.append(TensorBoardLogger(save_dir=output, name="", version=""))
        else:
            logger.info("tensorboard is not installed; logging to metrics.csv only (pip install 'detrkit[loggers]')")
    if train_config.clearml:
        raise NotImplementedError("clearml=True: ClearML logging is not supported; use wandb, mlflow or tensorboard")
    if train_config.wandb:
        _require("wandb")
        from pytorch_lightning.loggers import WandbLogger

        loggers.append(WandbLogger(project=train_config.project or "detrkit", name=train_config.run,
                                   save_dir=output))
    if train_config.mlflow:
        _require("mlflow")
        from pytorch_lightning.loggers import MLFlowLogger

        loggers.append(MLFlowLogger(experiment_name=train_config.project or "detrkit", run_name=train_config.run,
                                    tracking_uri=f"file:{Path(output) / 'mlruns'}"))
    return loggers


def _require(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise ImportError(f"{package}=True needs the {package} package: pip install 'detrkit[loggers]'")
