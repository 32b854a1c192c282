"""RFDETRModelModule: the detector, its losses and its optimisation as a LightningModule."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.transforms import batch_scale, multi_scale_sizes, resize_batch
from detrkit.losses.criterion import build_criterion
from detrkit.models.build import build_model
from detrkit.models.detector import Detector
from detrkit.models.postprocess import top_detections, top_keypoint_detections
from detrkit.ops.boxes import cxcywh_to_xyxy
from detrkit.structures import Batch, Target
from detrkit.training.accel.compile import (
    compile_detector,
    compile_mode,
    compiled_box_cost,
)
from detrkit.training.accel.cuda_graphs import GraphedTrainingForward, graphed_forward
from detrkit.training.accel.plan import AccelerationPlan
from detrkit.training.accel.precision import fused_adamw_applies
from detrkit.training.auto_batch import require_integer_batch
from detrkit.training.callbacks.interrupt import GracefulInterrupt, restarted_mid_epoch
from detrkit.training.callbacks.nonfinite import NonFiniteLossGuard, zero_loss
from detrkit.training.checkpoints import run_metadata
from detrkit.training.datamodule import PaddingShare
from detrkit.training.ema import ModelEMA
from detrkit.training.epoch_means import EpochMeans
from detrkit.training.evaluation import DetectionEvaluator, with_keypoints, with_masks
from detrkit.training.manual_step import (
    ManualAccumulation,
    require_data_parallel,
    step_schedulers,
    trains_manually,
)
from detrkit.training.optim import build_optimizer, build_scheduler
from detrkit.training.rng import restore_rng_states, rng_states
from detrkit.training.train_metrics import TrainingSetMetrics


class RFDETRModelModule(pl.LightningModule):
    """Trains `detector` (built from `model_config` when not given) as `train_config` says.

    Logs the epoch means of the `train/*` losses (summed here, so that a mid-epoch checkpoint keeps
    them; per step too with train_log_on_step) and `val/*` / `test/*` COCO metrics once per epoch.
    """

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, detector: Detector | None = None,
                 class_names: list[str] | None = None, model_name: str | None = None,
                 plan: AccelerationPlan | None = None) -> None:
        super().__init__()
        self.plan = plan  # compile, CUDA graphs and FP8 as decided for this run (None: none of them)
        self._train_forward: GraphedTrainingForward | None = None  # the training forward, when graphed
        require_integer_batch(train_config)
        self.model_config, self.train_config = model_config, train_config
        self.model = detector if detector is not None else build_model(model_config, train_config.drop_path)
        self.criterion = build_criterion(model_config, train_config)
        # keypoint training accumulates by hand, normalised by the window's box count (spec 7.7)
        self.manual_step = ManualAccumulation(train_config.grad_accum_steps) if trains_manually(train_config) else None
        self.automatic_optimization = self.manual_step is None
        self.nonfinite = NonFiniteLossGuard(train_config.skip_nonfinite_steps)  # a callback (configure_callbacks)
        self.interrupt = GracefulInterrupt(train_config, self.nonfinite)  # likewise
        self.epoch_means = EpochMeans()  # train/* sums of the running epoch
        self.class_names = class_names
        # the RFDETR class checkpoints name, so that from_checkpoint() rebuilds the same preset
        self.model_name = model_name or type(model_config).__name__.removesuffix("Config")
        self.ema: ModelEMA | None = None  # set by EMACallback at fit start
        block = model_config.block_size
        self.train_scales = (multi_scale_sizes(model_config.resolution, block, train_config.expanded_scales)
                             if train_config.multi_scale == "per-batch" else None)
        self._evaluators: dict[str, DetectionEvaluator] = {}
        self.train_metrics = (TrainingSetMetrics(train_config.eval_max_dets, train_config.eval_backend,
                                                 model_config.num_queries, model_config.num_select)
                              if train_config.compute_train_metrics else None)
        self._loss_stage: str | None = None  # "val" or "test" while that loss is logged (see _loss_wanted)
        self._padding_only = False  # this process's evaluation batches only pad (see PaddingShare)
        # "val/", "val/ema_", "test/" -> COCOeval's twelve summary numbers of the last evaluation
        self.coco_stats: dict[str, list[float]] = {}
        # evaluate() reads the last evaluation's detections here (analysis/evaluate.py)
        self.keep_evaluations = False
        self.kept_evaluations: dict[str, DetectionEvaluator] = {}
        self.kept_at_step = -1  # the optimizer step the kept evaluations scored the weights of

    def setup(self, stage: str) -> None:
        if self.class_names is None and self.trainer is not None:  # a custom loop: the data set knows
            self.class_names = getattr(self.trainer.datamodule, "class_names", None)
        if stage == "fit" and self.manual_step is not None:
            require_data_parallel(self.trainer.strategy)

    def on_fit_start(self) -> None:
        if self.plan is not None and self.plan.compile:  # in place, lazily: kernels build on the first step
            mode = compile_mode(self.model_config, self.train_config)
            rank_zero_info(mode.reason)
            compile_detector(self.model, mode, cuda_graph_trees=self.plan.cuda_graphs == "inductor")
            if self.device.type == "cuda":  # the matcher's L1 cost, compiled on its own (spec 16.2)
                self.criterion.matcher.box_cost = compiled_box_cost()
        self._train_forward = graphed_forward(self.model, self.plan, self.trainer.precision_plugin)

    def configure_callbacks(self) -> list[pl.Callback]:
        return [self.nonfinite, self.interrupt]

    def on_fit_end(self) -> None:
        self._train_forward = None  # frees the graphs' memory pools

    def forward(self, pixels: torch.Tensor, padding: torch.Tensor | None = None):
        return self.model(pixels, padding)

    def on_train_start(self) -> None:
        if restarted_mid_epoch(self.trainer):  # Lightning skips the epoch's start hooks there: run them
            for callback in self.trainer.callbacks:
                callback.on_train_epoch_start(self.trainer, self)
            self.on_train_epoch_start()

    def on_train_epoch_start(self) -> None:
        # Lightning keeps submodules that were in eval mode before fit in eval mode; an RFDETR's
        # detector is, after predict(). Training must run all query groups.
        self.model.train()
        self.coco_stats = {}

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        if self.train_scales:  # one scale per optimizer step, shared by its micro-batches
            batch = resize_batch(batch, batch_scale(self.global_step, self.train_scales))
        outputs = (self._train_forward or self.model)(batch.pixels, batch.padding)
        groups = self.model.groups if self.model.training else 1
        def admit(loss: torch.Tensor) -> bool:
            return self.nonfinite.admit(loss, batch, self.trainer, batch_idx)

        with torch.autocast(self.device.type, enabled=False):  # matching and losses in fp32
            if self.manual_step is not None:  # backward and optimizer step done here
                losses = self.manual_step(self, self.criterion, outputs, batch.targets, groups,
                                          batch.pixels.shape[-2:], batch_idx, admit)
            else:
                losses = self.criterion(outputs, batch.targets, groups=groups, image_size=batch.pixels.shape[-2:])
                admit(losses.total)
        if not self.nonfinite.admitted:  # a skipped step logs nothing; the guard drops its optimizer step
            return None if self.manual_step is not None else zero_loss(self)
        if self.train_metrics is not None:
            self.train_metrics.add(outputs, batch)
        size, config = len(batch), self.train_config
        self.log("loss", losses.total, prog_bar=True, on_step=True, on_epoch=False, logger=False, batch_size=size)
        # per-term values follow train_log_on_step only when each layer's term is logged on its own
        terms = {**(_compact_terms(losses.terms) if config.compact_train_metrics else losses.terms),
                 **{name: getattr(losses, name) for name in ("class_error", "cardinality_error")}}
        values = {"train/loss": losses.total, **{f"train/{name}": value for name, value in terms.items()}}
        self.epoch_means.add(values, size)  # logged as means at the epoch's last batch
        for name in values:
            if self._logged_per_step(name):
                self.log(f"{name}_step", values[name], on_step=True, on_epoch=False,
                         sync_dist=config.train_log_sync_dist, batch_size=size)
        # a CPU tensor: Lightning would copy a Python float to the device, a blocking copy each step
        lr = torch.tensor(self.trainer.optimizers[0].param_groups[0]["lr"])
        self.log("lr", lr, prog_bar=True, on_step=True, on_epoch=False, logger=False, batch_size=size)
        return losses.total

    def on_train_batch_end(self, outputs: Any, batch: Batch, batch_idx: int) -> None:
        """The epoch's train/* means at its last batch; then a pending Ctrl-C may stop the run
        here, after every callback has seen the step (see GracefulInterrupt)."""
        if self.trainer.is_last_batch and self.epoch_means:
            reduce = self._sum_over_processes if self.train_config.train_log_sync_dist else None
            for name, mean in self.epoch_means.take(reduce).items():
                forked = self._logged_per_step(name)  # named as Lightning names a value logged per step and epoch
                self.log(f"{name}_epoch" if forked else name, mean, on_step=False, on_epoch=True, batch_size=1)
                if forked:
                    self.log(name, mean, on_step=False, on_epoch=True, logger=False, batch_size=1)
        self.interrupt.after_step(self.trainer, batch_idx)

    def _logged_per_step(self, name: str) -> bool:
        """train_log_on_step logs the total loss, and each term when terms are not compacted."""
        config = self.train_config
        return config.train_log_on_step and (name == "train/loss" or not config.compact_train_metrics)

    def _sum_over_processes(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.trainer.strategy.reduce(tensor, reduce_op="sum")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.manual_step is not None:  # Lightning clips under automatic optimisation only
            self.configure_gradient_clipping(optimizer, self.train_config.clip_max_norm or None, "norm")

    def on_train_epoch_end(self) -> None:
        if self.manual_step is not None:  # likewise for epoch-interval and plateau schedulers
            step_schedulers(self, "epoch")
        if self.train_metrics is not None:  # train/mAP_50_95, ... beside validation's
            self._score_and_log({"train/": self.train_metrics.take()})

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate_step("val", batch)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate_step("test", batch)

    @property
    def evaluates_base_model(self) -> bool:
        """Whether validation scores the live weights (else only their moving average)."""
        return self.ema is None or self.train_config.eval_base_model

    def evaluation_tracks(self, stage: str) -> dict[str, Detector]:
        """Metric-name prefix -> detector to score: "" the live weights, "ema_" their average
        (validation only, once it has been updated; tests score the weights loaded for them)."""
        if stage != "val" or self.ema is None or not self.ema.updates:
            return {"": self.model}
        tracks = {"ema_": self.ema.module}
        if self.train_config.eval_base_model:
            tracks[""] = self.model
        return tracks

    def on_validation_epoch_start(self) -> None:
        self._loss_stage = "val" if self._loss_wanted("val") else None
        self._padding_only = _padding_only(self.trainer.val_dataloaders)

    def on_test_epoch_start(self) -> None:
        self._loss_stage = "test" if self._loss_wanted("test") else None
        self._padding_only = _padding_only(self.trainer.test_dataloaders)

    def _loss_wanted(self, stage: str) -> bool:
        """test/loss when compute_test_loss; val/loss when compute_val_loss is True, or "auto" and a
        scheduler or callback monitors it. Skipped (with a warning) where processes have different
        numbers of batches: the criterion's box count is reduced over processes once per batch."""
        config, trainer = self.train_config, self.trainer
        monitors = {getattr(callback, "monitor", None) for callback in trainer.callbacks}
        monitors |= {entry.monitor for entry in trainer.lr_scheduler_configs}
        if stage == "val" and config.compute_val_loss is False and "val/loss" in monitors:
            raise ValueError("compute_val_loss=False, but a callback or scheduler monitors 'val/loss': set "
                             "compute_val_loss=True or 'auto', or monitor another metric")
        wanted = config.compute_test_loss if stage == "test" else (
            config.compute_val_loss is True or (config.compute_val_loss == "auto" and "val/loss" in monitors))
        if not wanted or trainer.world_size == 1:
            return wanted
        batches = {"test": trainer.num_test_batches, "val": trainer.num_val_batches}[stage]
        if trainer.sanity_checking:
            batches = trainer.num_sanity_val_batches
        counts = self.all_gather(torch.tensor(sum(batches), device=self.device))
        if bool((counts != counts.flatten()[0]).any()):  # once per evaluation, outside any step
            rank_zero_warn(f"{stage}/loss is not logged: the processes have different numbers of {stage} batches")
            return False
        return True

    def _evaluate_step(self, stage: str, batch: Batch) -> None:
        sizes = torch.tensor([t.orig_size for t in batch.targets]).to(batch.pixels.device, non_blocking=True)
        truth = [_pixel_boxes(t) for t in batch.targets]
        tracks = self.evaluation_tracks(stage)
        for prefix, detector in tracks.items():
            with_loss = self._loss_stage == stage and prefix == ("" if "" in tracks else "ema_")  # {stage}/* report
            # masks of the auxiliary layers and proposals only where the loss reads them
            outputs = detector(batch.pixels, batch.padding, every_mask_layer=with_loss)
            if with_loss:
                with torch.autocast(self.device.type, enabled=False):  # matching and losses in fp32
                    loss = self.criterion(outputs, batch.targets, groups=1, image_size=batch.pixels.shape[-2:]).total
                self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(batch))
            detections, image_truth = self._scored(outputs, sizes, batch, truth)
            if not self._padding_only:  # a process without images of its own scores nothing
                self._evaluator(stage + "/" + prefix).add(detections, image_truth)

    def _scored(self, outputs, sizes: torch.Tensor, batch: Batch, truth: list[dict[str, torch.Tensor]]):
        """Per image detections and the ground truth to score them against, with masks or
        keypoints as the model predicts them."""
        config = self.model_config
        # scores from fp32 logits: bf16's 8-bit mantissa would tie many of them and move the AP
        logits, boxes = outputs.pred_logits.float(), outputs.pred_boxes.float()
        if outputs.pred_keypoints is not None:
            detections = top_keypoint_detections(logits, boxes, outputs.pred_keypoints.float(), sizes,
                                                 config.num_select, config.num_keypoints_per_class,
                                                 config.postprocess_trace_alpha)
            truth = [dict(t) for t in truth]
            with_keypoints(truth, batch.targets)
            return detections, truth
        detections = top_detections(logits, boxes, sizes, config.num_select, outputs.pred_masks)
        if outputs.pred_masks is not None:
            truth = [dict(t) for t in truth]  # masks of the size each track's detections take
            with_masks(detections, truth, batch.targets, tuple(batch.pixels.shape[-2:]),
                       self.train_config.eval_masks_head_resolution)
        return detections, truth

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def _evaluator(self, key: str) -> DetectionEvaluator:
        if key not in self._evaluators:
            config = self.train_config
            self._evaluators[key] = DetectionEvaluator(
                config.eval_max_dets, config.eval_backend,
                **({"class_names": self.class_names} if config.log_per_class_metrics else {}),
                masks=self.model.segmentation_head is not None, keypoints=bool(self.model_config.use_grouppose_keypoints),
                keypoint_sigmas=config.keypoint_oks_sigmas)
        return self._evaluators[key]

    def _log_evaluation(self, stage: str) -> None:
        """Score the epoch once: every process contributes its images, the main process computes,
        and all processes log the same numbers (so callbacks agree on them everywhere)."""
        keys = [stage + "/" + prefix for prefix in self.evaluation_tracks(stage)]
        evaluators = {key: self._evaluator(key) for key in keys}  # also where this process had no batch
        self._evaluators = {}
        for evaluator in evaluators.values():
            evaluator.gather()
        if self.keep_evaluations:
            self.kept_evaluations, self.kept_at_step = evaluators, self.global_step
        self._score_and_log(evaluators, stage)

    def _score_and_log(self, evaluators: dict[str, DetectionEvaluator], stage: str | None = None) -> None:
        """The main process computes gathered evaluators and every process logs the same numbers;
        `stage`'s EMA-only numbers also go under its main keys."""
        if not any(len(evaluator) for evaluator in evaluators.values()):
            return  # no batch anywhere (limit_val_batches=0, say)
        scores = ({key: (evaluator.compute(), evaluator.coco_stats) for key, evaluator in evaluators.items()}
                  if self.trainer.is_global_zero else None)
        scores = self.trainer.strategy.broadcast(scores, src=0)
        if stage is not None and f"{stage}/" not in scores and f"{stage}/ema_" in scores:
            scores[f"{stage}/"] = scores[f"{stage}/ema_"]  # EMA-only validation: the main keys show it
        self.coco_stats.update({key: stats for key, (_, stats) in scores.items()})
        for prefix, (values, _) in scores.items():
            for name, value in values.items():
                self.log(prefix + name, value, sync_dist=False)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint.update(run_metadata(self))
        checkpoint["rng_states"] = rng_states()
        if self.epoch_means:  # written mid-epoch (Ctrl-C): what the epoch's logs have summed so far
            # every process's own sums (and training-set detections), each restored to its process
            checkpoint["epoch_means"] = self._per_process(self.epoch_means.state_dict())
            if self.train_metrics is not None:
                checkpoint["train_metrics"] = self._per_process(self.train_metrics.state_dict())
        if self.interrupt.stopped_at is not None:
            checkpoint["interrupted_at"] = self.interrupt.stopped_at

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
        rank = self.trainer.global_rank if self._trainer is not None else 0
        if len(checkpoint.get("epoch_means", ())) > rank:
            self.epoch_means.load_state_dict(checkpoint["epoch_means"][rank])
        if len(checkpoint.get("train_metrics", ())) > rank and self.train_metrics is not None:
            self.train_metrics.load_state_dict(checkpoint["train_metrics"][rank])

    def _per_process(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        """`state` of every process, in process order (each process must call this)."""
        if self.trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return [state]
        states: list[Any] = [None] * self.trainer.world_size
        dist.all_gather_object(states, state)
        return states

    def configure_optimizers(self) -> dict[str, Any]:
        """The configured optimizer over detrkit's parameter groups, and its schedule (spec 12.2-12.3)."""
        config = self.train_config
        optimizer = build_optimizer(self.model.named_parameters(), {
            "lr": config.lr, "lr_encoder": config.lr_encoder, "weight_decay": config.weight_decay,
            "layer_decay": config.lr_vit_layer_decay, "component_decay": config.lr_component_decay,
            "num_encoder_layers": self.model_config.out_feature_indexes[-1] + 1}, fused=self.fused_optimizer,
            optimizer=config.optimizer, optimizer_kwargs=config.optimizer_kwargs)
        scheduler = build_scheduler(
            optimizer, config.lr_scheduler, config.lr_scheduler_kwargs,
            total_steps=(self.manual_step.optimizer_steps(self.trainer) if self.manual_step is not None
                         else int(self.trainer.estimated_stepping_batches)), epochs=config.epochs,
            warmup_epochs=config.warmup_epochs, interval=config.lr_scheduler_interval,
            monitor=config.lr_scheduler_monitor)
        if "monitor" in scheduler:
            if scheduler["monitor"] == "val/loss" and config.compute_val_loss is False:
                raise ValueError("compute_val_loss=False leaves ReduceLROnPlateau without its monitor 'val/loss'")
            # validation metrics exist only on epochs that validate
            scheduler["strict"] = config.eval_interval == 1 or not scheduler["monitor"].startswith("val/")
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    @property
    def fused_optimizer(self) -> bool:
        return fused_adamw_applies(self.model_config.fused_optimizer, self.device.type, self.trainer.precision)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning refuses to clip for optimizers that unscale inside step() (fused AdamW); under
        bf16 nothing is scaled, so the global norm of the optimizer's parameters is clipped here."""
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        elif gradient_clip_val:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val, foreach=True)


def _padding_only(loaders: Any) -> bool:
    return isinstance(getattr(loaders, "sampler", None), PaddingShare)


def _compact_terms(terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Final-layer terms as they are; auxiliary and encoder terms summed into `<term>_aux`."""
    compact: dict[str, torch.Tensor] = {}
    for name, value in terms.items():
        stem, _, suffix = name.rpartition("_")
        key = f"{stem}_aux" if suffix.isdigit() or suffix == "enc" else name
        compact[key] = compact[key] + value if key in compact else value
    return compact


def _pixel_boxes(target: Target) -> dict[str, torch.Tensor]:
    """Ground truth in source-image pixels (xyxy), as the COCO metric expects, crowd regions
    appended with iscrowd 1 so that detections on them are ignored. An area of 0 (crowds, or
    no area given) makes the metric take the box's."""
    height, width = target.orig_size
    scale = target.boxes.new_tensor([width, height, width, height])
    boxes = cxcywh_to_xyxy(target.boxes) * scale
    count = len(target.labels)
    area = target.area if target.area is not None else boxes.new_zeros(count)
    crowd_boxes = target.crowd_boxes if target.crowd_boxes is not None else boxes.new_zeros((0, 4))
    crowd_labels = target.crowd_labels if target.crowd_labels is not None else target.labels.new_zeros(0)
    crowds = len(crowd_labels)
    return {"boxes": torch.cat([boxes, crowd_boxes.to(boxes.dtype)]),
            "labels": torch.cat([target.labels, crowd_labels.to(target.labels.dtype)]),
            "iscrowd": torch.cat([target.labels.new_zeros(count), target.labels.new_ones(crowds)]),
            "area": torch.cat([area.to(boxes.dtype), boxes.new_zeros(crowds)])}
