"""Score a detector on one split of a data set exactly as training validation does, then analyse it."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Literal

import pytorch_lightning as pl
import torch

from detrkit.analysis.dataset_stats import dataset_stats
from detrkit.analysis.result import EvaluationResult, per_class_results
from detrkit.analysis.tide import tide_breakdown
from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.detect import build_datasets
from detrkit.datasets.keypoint_schema import KeypointSchema
from detrkit.training import RFDETRDataModule, RFDETRModelModule
from detrkit.training.confidence_sweep import sweep_confidence
from detrkit.training.evaluation import DetectionEvaluator
from detrkit.training.trainer import plan_run

Split = Literal["valid", "test", "train"]


def evaluate_detector(detector: torch.nn.Module, model_config: ModelConfig, train_config: TrainConfig,
                      class_names: Sequence[str] | None, split: Split = "valid", model_name: str | None = None,
                      ) -> EvaluationResult:
    """Run validation's metric (RFDETRModelModule's validation step and DetectionEvaluator, under
    the precision training would use) over `split` of `train_config.dataset_dir`, images in
    their evaluation transform, and build the result: per class numbers, the confidence sweep,
    the data set's stats and the TIDE breakdown. The detector is left in eval mode."""
    splits = build_datasets(train_config, model_config)
    chosen = {"valid": splits.valid, "test": splits.test, "train": splits.train}[split]
    if chosen is None:
        raise FileNotFoundError(f"{train_config.dataset_dir} has no {split} split")
    if split == "train":  # scored as validation sees images: no augmentation
        chosen = copy.copy(chosen)
        chosen.transform = splits.valid.transform
    names = list(class_names) if class_names is not None else splits.class_names
    datamodule = RFDETRDataModule(model_config, train_config, splits=dataclasses.replace(splits, valid=chosen))
    module = RFDETRModelModule(model_config, train_config, detector=detector, class_names=names,
                               model_name=model_name)
    module.keep_evaluations = True
    plan = plan_run(model_config, train_config, {})
    trainer = pl.Trainer(accelerator=_accelerator(train_config, model_config), devices=1, precision=plan.precision,
                         logger=False, enable_checkpointing=False, enable_progress_bar=train_config.progress_bar is not None,
                         enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0)
    detector.eval()
    trainer.validate(module, datamodule=datamodule, verbose=False)
    detector.eval()
    return evaluator_result(module.kept_evaluations["val/"], names, split, chosen, splits.keypoint_schema,
                            train_config)


def evaluator_result(evaluator: DetectionEvaluator, class_names: Sequence[str], split: str, dataset,
                     keypoint_schema: KeypointSchema | None, train_config: TrainConfig) -> EvaluationResult:
    """The result of a filled evaluator whose images are `dataset`'s, in its order."""
    metrics = {name: float(value) for name, value in evaluator.compute().items()}
    result = analyse(evaluator.detections, evaluator.truth, class_names, split, metrics, evaluator.coco_stats,
                     train_config.eval_max_dets, train_config.eval_backend)
    return dataclasses.replace(result, image_paths=[record.path for record in dataset.records][:len(evaluator)],
                               keypoint_skeletons=keypoint_schema.edges if keypoint_schema is not None else [])


def result_after_training(module: RFDETRModelModule, trainer: pl.Trainer, splits, model_config: ModelConfig,
                          train_config: TrainConfig, class_names: Sequence[str], model_name: str) -> EvaluationResult:
    """evaluate()'s result on the validation split for the weights validation scored last (the EMA
    unless the live weights are scored too): the last validation's own detections when no step
    came after it (train() keeps them), else a fresh evaluation."""
    track = "val/" if module.evaluates_base_model or not module.ema.updates else "val/ema_"
    kept = module.kept_evaluations.get(track)
    if kept is not None and len(kept) and module.kept_at_step == trainer.global_step:
        return evaluator_result(kept, class_names, "valid", splits.valid, splits.keypoint_schema, train_config)
    detector = module.model if track == "val/" else module.ema.module
    config = train_config.model_copy(update={"progress_bar": None})
    return evaluate_detector(detector, model_config, config, class_names, "valid", model_name)


def analyse(detections: list[dict[str, torch.Tensor]], truth: list[dict[str, torch.Tensor]],
            class_names: Sequence[str], split: str, metrics: dict[str, float], coco_stats: list[float],
            max_dets: int, backend: str) -> EvaluationResult:
    """The result object of scored detections (torchmetrics-style dicts, pixels xyxy)."""
    boxes = [{k: d[k] for k in ("boxes", "scores", "labels")} for d in detections]
    sweep = sweep_confidence(boxes, truth)
    stats = dataset_stats(truth, class_names)
    per_class = per_class_results(boxes, truth, class_names, sweep, stats, max_dets, backend)
    return EvaluationResult(split, metrics, list(coco_stats), per_class, sweep, stats, tide_breakdown(boxes, truth),
                            detections, truth, class_names=list(class_names))


def _accelerator(train_config: TrainConfig, model_config: ModelConfig) -> str:
    device = train_config.device or model_config.device
    return {"cuda": "gpu"}.get(device.split(":")[0], device.split(":")[0])
