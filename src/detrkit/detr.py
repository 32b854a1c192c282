"""RFDETR: the user-facing model object; builds, loads and runs the detector, delegating the work."""

from __future__ import annotations

import logging
import os
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.coco_categories import COCO_CATEGORIES
from detrkit.datasets.images import BatchPreparer, ImageInput, to_source_image, to_tensor
from detrkit.datasets.sources import open_source
from detrkit.key_points import as_key_points
from detrkit.models.build import build_model
from detrkit.models.download import resolve_weights
from detrkit.models.postprocess import detections_above, keypoint_pixel_covariance, select_detections
from detrkit.models.weights import load_weights, read_checkpoint, reset_keypoint_precision

if TYPE_CHECKING:
    import supervision as sv

logger = logging.getLogger(__name__)

_INFERENCE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class RFDETR:
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

    def predict(self, images: ImageInput | Sequence[ImageInput] | Iterator[ImageInput], threshold: float = 0.5,
                shape: tuple[int, int] | None = None, *, batch: int | None = None, stream: bool = False,
                vid_stride: int = 1, include_source_image: bool = True,
                ) -> sv.Detections | sv.KeyPoints | list[sv.Detections | sv.KeyPoints] | Iterator:
        """Detect objects; one `supervision.Detections` (keypoint models: `KeyPoints`) per image or frame.

        Sources: an image (path, PIL image, HWC uint8 RGB array, CHW tensor: uint8 or float in
        [0, 1]) gives one Detections; a directory (its images, by name), a glob ("imgs/*.jpg"), a
        video file, a list or tuple of any of these, or an iterator of images give a list.
        Keywords: `threshold` (strict); `shape` (H, W) to resize to (default: the resolution);
        `batch` images per forward pass (default: a list of images at once, anything else one
        at a time); `stream=True` returns a generator that reads each image only when its batch
        is due; `vid_stride=N` keeps every N-th video frame; `include_source_image` stores the
        HWC uint8 image in `detections.metadata["source_image"]`. Missing paths raise at once.
        Segmentation models fill `detections.mask`: (N, H, W) bool in the source image's pixels.
        Keypoint models return `supervision.KeyPoints`, as rfdetr does: `xy` (N, K, 2) in source
        pixels, `keypoint_confidence` (N, K) σ(findable), `detection_confidence` (N,) the score the
        threshold compares (fused with keypoint uncertainty, see postprocess_trace_alpha), `class_id`;
        `data` holds the boxes as "xyxy" (N, 4), "covariance" (N, K, 2, 2) in pixels², the raw
        "keypoint_precision_cholesky" (N, K, 3), "class_name", "source_shape" and, per row,
        "source_image" (KeyPoints has no metadata). See key_points.as_key_points.
        """
        source = open_source(images, batch=batch, vid_stride=vid_stride)
        preparer = self._preparer(shape)
        results = (detections for chunk in source.batches()
                   for detections in self._detect_batch(chunk, threshold, preparer, include_source_image))
        if stream:
            return results
        return next(results) if source.single else list(results)

    def _detect_batch(self, images: list[ImageInput], threshold: float, preparer: BatchPreparer,
                      include_source_image: bool) -> list[sv.Detections | sv.KeyPoints]:
        """One forward pass over `images`, each resized by `preparer`."""
        tensors = [to_tensor(image, self.model_config.num_channels) for image in images]
        sizes = torch.tensor([t.shape[-2:] for t in tensors])
        with torch.inference_mode():
            self.model.eval()
            with self._inference_autocast():
                outputs = self.model(preparer(tensors))
            config = self.model_config
            results = select_detections(outputs, sizes.to(self.device), config.num_select,
                                        config.num_keypoints_per_class, config.postprocess_trace_alpha)
        return [self._to_detections(result, threshold, tuple(size.tolist()),
                                    to_source_image(tensor) if include_source_image else None)
                for result, size, tensor in zip(results, sizes, tensors)]

    def _inference_autocast(self) -> torch.autocast:
        """Autocast to the config's inference_dtype ("fp32": off); scores and boxes leave in fp32."""
        dtype = _INFERENCE_DTYPES[self.model_config.inference_dtype]
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def _preparer(self, shape: tuple[int, int] | None) -> BatchPreparer:
        size = tuple(shape) if shape else (self.model_config.resolution,) * 2
        block = self.model_config.block_size
        if len(size) != 2 or any(side <= 0 or side % block for side in size):
            raise ValueError(f"shape={shape} must be two positive sides divisible by {block}")
        if size not in self._preparers:
            self._preparers[size] = BatchPreparer(size, self.model_config.num_channels, self.device)
        return self._preparers[size]

    def _to_detections(self, result: dict[str, torch.Tensor], threshold: float, source_shape: tuple[int, int],
                       source_image: np.ndarray | None = None) -> sv.Detections | sv.KeyPoints:
        """Detections above `threshold`, with (N, H, W) bool masks at the source size for segmentation
        models, as KeyPoints for keypoint models; the same dtypes whether empty or not."""
        import supervision as sv  # heavy import, deferred so that `import detrkit` stays fast

        kept = detections_above(result, threshold, source_shape)
        class_id = kept["labels"].cpu().numpy().astype(np.int64, copy=False)
        detections = sv.Detections(
            xyxy=kept["boxes"].float().cpu().numpy().reshape(-1, 4),
            confidence=kept["scores"].float().cpu().numpy(),
            class_id=class_id, mask=kept["masks"].cpu().numpy() if "masks" in kept else None)
        detections.data["class_name"] = np.array([self.class_name(int(c)) for c in class_id], dtype=object)
        detections.data["source_shape"] = np.tile(np.array(source_shape, dtype=np.int64), (len(class_id), 1))
        if source_image is not None:
            detections.metadata["source_image"] = source_image
        if "keypoints" in kept:
            covariance = keypoint_pixel_covariance(kept["keypoint_precision_cholesky"].cpu().double(), source_shape)
            return as_key_points(detections, kept, covariance, source_image)
        return detections

    def class_name(self, class_id: int) -> str:
        """Name of a predicted class id: raw COCO ids for COCO-pretrained heads, else an index
        into class_names, whose extra last slot is the background."""
        num_classes, names = self.model.num_classes, self.class_names
        coco_head = num_classes == 90 and (names is None or set(names) == set(COCO_CATEGORIES.values()))
        if coco_head:
            return COCO_CATEGORIES.get(class_id, str(class_id))
        if class_id == num_classes:
            return "__background__"
        return names[class_id] if names is not None and class_id < len(names) else str(class_id)

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
        if resume is not None:
            carry_over_metrics(trainer, train_config.output_dir, resume.epoch)
            if not resume.full:
                warm_start(resume, trainer, module, train_config.output_dir)
        self.model.train()
        with fp8_layers(self.model, plan.fp8_backend):
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume.ckpt_path if resume else None)
        if train_config.run_test and datamodule.splits.test is not None:
            self._test_best_weights(trainer, module, datamodule)
        self.model.to(self.device).eval()

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
