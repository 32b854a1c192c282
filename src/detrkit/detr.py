"""RFDETR: the user-facing model object; builds, loads and runs the detector, delegating the work."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.images import BatchPreparer
from detrkit.models.build import build_model
from detrkit.models.deploy_graph import DeployGraph
from detrkit.models.download import resolve_weights
from detrkit.models.weights import load_weights, read_checkpoint, reset_keypoint_precision
from detrkit.predictor import Predictor

logger = logging.getLogger(__name__)

_INFERENCE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class RFDETR(Predictor):
    """A detector with its config. `RFDETRNano(...)` and friends are presets of this class.

    Keyword arguments are ModelConfig fields; unknown ones raise pydantic's ValidationError.
    """

    config_class: ClassVar[type[ModelConfig]] = ModelConfig
    train_config_class: ClassVar[type[TrainConfig]] = TrainConfig

    def __init__(self, **kwargs: Any) -> None:
        config = self.config_class(**kwargs)
        self._num_classes_given = "num_classes" in kwargs
        checkpoint = read_checkpoint(resolve_weights(config.pretrain_weights)) if config.pretrain_weights else None
        if checkpoint is not None and "num_classes" not in config.model_fields_set:
            config = config.model_copy(update={"num_classes": checkpoint.num_logits - 1})
        self.model_config = config
        self.model = build_model(config)
        self.class_names: list[str] | None = None
        self._pretrained_untrained = checkpoint is not None  # published or given weights, not yet trained here
        if checkpoint is not None:
            load_weights(self.model, checkpoint)
            self.class_names = checkpoint.class_names
        self.model.to(config.device).eval()
        self._preparers: dict[tuple[int, int], BatchPreparer] = {}
        # rfdetr's hook dictionary: event -> functions called during train() (training.callbacks.user_hooks)
        self.callbacks: dict[str, list[Callable[..., Any]]] = defaultdict(list)

    @property
    def device(self) -> torch.device:
        return torch.device(self.model_config.device)

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def _channels(self) -> int:
        return self.model_config.num_channels

    @property
    def _block_size(self) -> int:
        return self.model_config.block_size

    @property
    def _default_size(self) -> tuple[int, int]:
        return (self.model_config.resolution,) * 2

    @property
    def _device(self) -> torch.device:
        return self.device

    def deploy_graph(self, raw: bool = False) -> DeployGraph:
        """The detector with its post-processing (the config's num_select, keypoint schema and
        trace alpha) as one module: what predict() runs and export() writes."""
        config = self.model_config
        return DeployGraph(self.model, config.num_select, config.num_keypoints_per_class,
                           config.postprocess_trace_alpha, raw=raw)

    def _run_graph(self, pixels: torch.Tensor, raw: bool = False) -> dict[str, torch.Tensor]:
        """DeployGraph outputs by name, the network under the config's inference_dtype autocast."""
        self.model.eval()
        graph = self.deploy_graph(raw)
        with self._inference_autocast():
            return dict(zip(graph.names, graph(pixels)))

    def _inference_autocast(self) -> torch.autocast:
        """Autocast to the config's inference_dtype ("fp32": off); scores and boxes leave in fp32."""
        dtype = _INFERENCE_DTYPES[self.model_config.inference_dtype]
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def export(self, format: str = "onnx", output_dir: str | os.PathLike = "output", *,
               batch_size: int | str = 1, opset: int | None = None, half: bool = False, simplify: bool = True,
               raw: bool = False, check: bool = True, dataset_dir: str | os.PathLike | None = None,
               threshold: float = 0.5, map_tolerance: float = 0.5, min_matched: float = 0.99,
               check_images: int = 100, quantize: str | None = None, calibration_images: int = 32,
               sampling: str = "grid_sample", opset_version: int | None = None) -> Path:
        """Export to `output_dir/inference_model.onnx` (format="onnx") or OpenVINO IR
        `inference_model.xml` + `.bin` (format="openvino"), then check it; returns the file's path.

        The graph takes `pixels` (B, C, H, W) float32 normalised as predict() normalises (the
        metadata says how) at the model's resolution and returns the post-processed top
        num_select: `boxes` xyxy normalised to [0, 1], `scores`, `labels`, plus `masks` logits
        (segmentation) or `keypoints` and `keypoint_precision_cholesky` (keypoint models); see
        detrkit.models.deploy_graph. `raw=True` returns the heads' outputs (pred_logits, ...)
        instead. `batch_size` is fixed or "dynamic"; `opset` (alias rfdetr's `opset_version`)
        at least 16; `half` runs the network in fp16 (post-processing stays fp32); `simplify`
        uses onnxslim when installed. Metadata (classes, resolution, variant, version,
        normalisation, post-processing) is stored in the file.

        The accuracy check runs the file beside this model on the first `check_images` images of
        `dataset_dir`'s validation split (then also comparing box mAP), else on 8 fixed synthetic
        images, prints a table and writes it to `<file>.check.json`. Fewer than `min_matched` of
        the detections above `threshold` matched (IoU >= 0.9, same class), or a mAP drop above
        `map_tolerance` points, raises ExportAccuracyError (the table also goes to
        `<file>.failed-check.json`) and leaves output_dir without the file;
        `check=False` skips the check. detrkit.export.load_exported(path).predict(...) runs the file.

        `quantize="int8"` writes an int8 file calibrated on the first `calibration_images` training
        images of `dataset_dir` (or synthetic shapes without one): ONNX by onnxruntime's static
        quantization (int8 weights per channel, uint8 activations), OpenVINO by NNCF. It goes
        through the same check. `sampling="gather"` exports deformable attention with
        GatherElements instead of GridSample, for runtimes that lack GridSample.
        """
        from detrkit.export.onnx import DEFAULT_OPSET
        from detrkit.export.writer import export_model

        if opset is not None and opset_version is not None and opset != opset_version:
            raise ValueError(f"opset={opset} and opset_version={opset_version} disagree; pass one")
        chosen = opset if opset is not None else opset_version if opset_version is not None else DEFAULT_OPSET
        return export_model(self, format, output_dir, batch_size, chosen, half, simplify, raw, check, dataset_dir,
                            threshold, map_tolerance, min_matched, check_images, quantize, calibration_images,
                            sampling)

    def evaluate(self, dataset_dir: str | os.PathLike, split: str = "valid", batch_size: int | None = None,
                 eval_backend: str | None = None, threshold: float | None = None,
                 output_dir: str | os.PathLike | None = None, plots: bool = True, **kwargs: Any):
        """Score the model on `split` ("valid", "test" or "train", unaugmented) of a COCO or YOLO
        folder with the metric training validation logs (the same numbers), and analyse it:
        returns a detrkit.analysis.result.EvaluationResult (overall and per-class AP/AR,
        precision/recall/F1 at the best confidence, the sweep, data set stats, TIDE breakdown).
        With `plots`, PNGs go to `output_dir/plots/` (default output_dir: TrainConfig's); the
        confusion matrix and galleries use `threshold` (default: the best confidence). Other
        keywords are TrainConfig fields (num_workers, eval_max_dets, ...)."""
        from detrkit.analysis.evaluate import evaluate_detector

        given = dict(batch_size=batch_size, eval_backend=eval_backend, output_dir=output_dir)
        train_config = self.get_train_config(dataset_dir=str(dataset_dir), **{k: v for k, v in given.items()
                                                                             if v is not None}, **kwargs)
        result = evaluate_detector(self.model, self.model_config, train_config, self.class_names, split,
                                   type(self).__name__)
        if plots:
            from detrkit.analysis.report import write_plots

            result = write_plots(result, Path(train_config.output_dir) / "plots", threshold)
        return result

    def get_train_config(self, **kwargs: Any) -> TrainConfig:
        """The TrainConfig that train(**kwargs) would use (Lightning Trainer arguments aside)."""
        return self.train_config_class(**kwargs)

    def train(self, **kwargs: Any) -> None:
        """Fine-tune (or train from scratch) on a COCO or YOLO folder; see TrainConfig for options.

        Keywords are TrainConfig fields, or Lightning Trainer arguments that are passed through.
        The data set is read and checked before anything is written to `output_dir`.
        """
        import pytorch_lightning as pl

        from detrkit.training import RFDETRDataModule, RFDETRModelModule, build_trainer
        from detrkit.training.accel.fp8 import fp8_layers
        from detrkit.training.resume import open_resume_point, warm_start
        from detrkit.training.run_record import carry_over_metrics
        from detrkit.training.trainer import plan_run, split_train_kwargs

        from detrkit.training.callbacks.user_hooks import UserHooks

        train_config, trainer_kwargs = split_train_kwargs(kwargs, self.train_config_class)
        if any(self.callbacks.values()):
            trainer_kwargs["callbacks"] = [*trainer_kwargs.get("callbacks", []), UserHooks(self.callbacks)]
        train_config = self._settle_precision_and_batch(train_config)
        plan = plan_run(self.model_config, train_config, trainer_kwargs)
        datamodule = RFDETRDataModule(self.model_config, train_config)
        self._fit_classes(datamodule.class_names)
        from detrkit.analysis.train_batches import batch_plot_callbacks  # what the model sees, drawn

        trainer_kwargs["callbacks"] = [*trainer_kwargs.get("callbacks", []), *batch_plot_callbacks(
            train_config.train_batch_plots, train_config.save_dataset_grids, train_config.output_dir,
            self.class_names, datamodule.splits.keypoint_schema)]
        resume = (open_resume_point(train_config.resume, train_config.output_dir, self.model)
                  if train_config.resume else None)
        if self._pretrained_untrained and resume is None:  # fine-tuning starts keypoints at unit precision
            reset_keypoint_precision(self.model)
        self._pretrained_untrained = False
        if train_config.seed is not None:
            pl.seed_everything(train_config.seed + int(os.environ.get("RANK", 0)), workers=True, verbose=False)
        module = RFDETRModelModule(self.model_config, train_config, detector=self.model, class_names=self.class_names,
                                   model_name=type(self).__name__, plan=plan)
        trainer = build_trainer(train_config, plan=plan, **trainer_kwargs)
        module.keep_evaluations = train_config.evaluation_plots and trainer.world_size == 1  # plots reuse them
        if resume is not None:
            carry_over_metrics(trainer, train_config.output_dir, resume.epoch)
            if not resume.full:
                warm_start(resume, trainer, module, train_config.output_dir)
        self.model.train()
        with fp8_layers(self.model, plan.fp8_backend), datamodule.naming_worker_deaths():
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume.ckpt_path if resume else None)
        if train_config.run_test and datamodule.splits.test is not None:
            self._test_best_weights(trainer, module, datamodule)
        if trainer.is_global_zero and os.path.isfile(os.path.join(train_config.output_dir, "metrics.csv")):
            from detrkit.analysis.results_plot import plot_results

            plot_results(os.path.join(train_config.output_dir, "metrics.csv"),
                         os.path.join(train_config.output_dir, "plots", "results.png"))
        self.model.to(self.device).eval()
        if train_config.evaluation_plots and trainer.world_size == 1:
            self._plot_after_training(module, trainer, datamodule, train_config)

    def _plot_after_training(self, module, trainer, datamodule, train_config: TrainConfig) -> None:
        from detrkit.analysis.evaluate import result_after_training
        from detrkit.analysis.report import write_plots

        result = result_after_training(module, trainer, datamodule.splits, self.model_config, train_config,
                                       self.class_names, type(self).__name__)
        write_plots(result, Path(train_config.output_dir) / "plots")

    def _settle_precision_and_batch(self, train_config):
        """The deprecated amp=False folded into amp_dtype; batch_size="auto" probed on the training
        GPU, before any data is read."""
        if not self.model_config.amp and "amp_dtype" not in train_config.model_fields_set:
            warnings.warn("amp=False on the model is deprecated: pass amp_dtype='fp32' to train(); training "
                          "in fp32", FutureWarning, stacklevel=3)
            train_config = train_config.model_copy(update={"amp_dtype": "fp32"})
        if train_config.batch_size == "auto":
            from detrkit.training.auto_batch import probe_device, process_count, resolve_auto_batch

            self.model.to(probe_device(train_config, self.device))
            train_config = resolve_auto_batch(self.model, self.model_config, train_config,
                                              process_count(train_config.devices, train_config.num_nodes))
        return train_config

    def _test_best_weights(self, trainer, module, datamodule) -> None:
        """Score checkpoint_best_total.pth on the test split (logged as test/*), then go back to
        the final weights. The main process reads the file and hands the weights to the others."""
        from detrkit.training.checkpoints import BEST_TOTAL

        strategy = trainer.strategy
        strategy.barrier()  # the main process has written the file
        best = os.path.join(module.train_config.output_dir, BEST_TOTAL)
        weights = read_checkpoint(best).weights if trainer.is_global_zero and os.path.isfile(best) else None
        weights = strategy.broadcast(weights, src=0)
        if weights is None:
            return
        final = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(weights)
        with datamodule.naming_worker_deaths():
            trainer.test(module, datamodule=datamodule)
        self.model.load_state_dict(final)

    def _fit_classes(self, class_names: list[str]) -> None:
        """Size the class head for the data set (unless num_classes was set explicitly)."""
        wanted = len(class_names)
        if self._num_classes_given and self.model_config.num_classes != wanted:
            if self.model_config.num_classes < wanted:
                raise ValueError(f"num_classes={self.model_config.num_classes} but the data set has {wanted} "
                                 f"classes {class_names}")
        else:
            self.model_config = self.model_config.model_copy(update={"num_classes": wanted})
        self.model.resize_class_heads(self.model_config.num_classes + 1)
        self.class_names = list(class_names)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, *, trust_checkpoint: bool = False,
                        **overrides: Any) -> RFDETR:
        """Rebuild the model a checkpoint was saved from (class, config and weights); keyword
        arguments override saved config fields. The class comes from the checkpoint (its model
        name, else its weights' or file's name), whichever class this is called on; `cls` is the
        fallback when the checkpoint names none. `trust_checkpoint` is rfdetr's switch to unpickle
        arbitrary objects: detrkit never does, so it only warns."""
        from detrkit.variants import model_class_for

        if trust_checkpoint:
            warnings.warn("trust_checkpoint=True has no effect: detrkit reads checkpoints with weights_only=True "
                          "(tensors and plain training arguments only)", UserWarning, stacklevel=2)
        checkpoint = read_checkpoint(path)
        saved = checkpoint.model_config or checkpoint.args
        if not saved:
            raise ValueError(f"{path} holds no model config or args to rebuild the model from; "
                             "load it with pretrain_weights= on the right model class instead")
        model_class = model_class_for(checkpoint, path)
        model_class = cls if model_class is RFDETR else model_class
        # the class count comes from the weights when not overridden, and train() may still adapt it
        fields = set(model_class.config_class.model_fields) - {"device", "pretrain_weights", "num_classes"}
        kwargs = {k: v for k, v in saved.items() if k in fields}
        kwargs.update(overrides)
        kwargs["pretrain_weights"] = str(checkpoint.path)
        return model_class(**kwargs)


def from_checkpoint(path: str | os.PathLike, *, trust_checkpoint: bool = False, **overrides: Any) -> RFDETR:
    """`RFDETR.from_checkpoint`, as a function: the model class is read from the checkpoint."""
    return RFDETR.from_checkpoint(path, trust_checkpoint=trust_checkpoint, **overrides)
