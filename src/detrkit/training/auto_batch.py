"""batch_size="auto": probe the GPU for the largest micro-batch a training step fits in (spec 16.5)."""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.transforms import multi_scale_sizes
from detrkit.losses.criterion import build_criterion
from detrkit.structures import Batch, Target
from detrkit.training.accel.precision import (
    device_indices,
    fused_adamw_applies,
    resolve_precision,
    selected_accelerators,
)
from detrkit.training.trainer import launched_topology

logger = logging.getLogger(__name__)

LARGEST_PROBE = 128  # doubling stops here: larger micro-batches buy no speed for these models
SAFETY = 0.9  # share of the largest fitting batch used, for fragmentation and uneven real batches
_EPS = 1e-9  # floor(90 * 0.7) must be 63, not 62 (90 * 0.7 == 62.99999999999999 in floats)


@dataclass(frozen=True)
class AutoBatch:
    """The outcome of the search: per-device batch_size and grad_accum_steps, the largest batch
    that fitted, and the batch sizes probed in order."""

    batch_size: int
    grad_accum_steps: int
    max_fitting: int
    probed: tuple[int, ...]


def largest_fitting(fits: Callable[[int], bool], limit: int = LARGEST_PROBE) -> tuple[int, list[int]]:
    """The largest batch size `fits` accepts (at most `limit`) and the sizes tried, in order.

    Batch 1 runs twice: the first step allocates the optimizer state, the second measures a step
    with it in place. Then 2, 4, 8, ... until one fails, then a binary search below the failure.
    """
    probed: list[int] = []

    def attempt(size: int) -> bool:
        probed.append(size)
        return fits(size)

    if not (attempt(1) and attempt(1)):
        raise RuntimeError(
            'batch_size="auto": not even a batch of 1 image fits in GPU memory. Lower the memory a step needs '
            "with gradient_checkpointing=True on the model constructor (e.g. RFDETRNano(gradient_checkpointing=True))"
            " or a lower resolution=, then try again")
    good, bad = 1, None
    while bad is None and good < limit:
        size = min(good * 2, limit)
        if attempt(size):
            good = size
        else:
            bad = size
    while bad is not None and bad - good > 1:  # good fits, bad does not
        middle = (good + bad) // 2
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, probed


def safe_batch(max_fitting: int, use_ema: bool, ema_headroom: float) -> int:
    """90% of the largest fitting batch, scaled by `ema_headroom` when an EMA copy also lives on the GPU."""
    safe = max(1, math.floor(max_fitting * SAFETY + _EPS))
    if use_ema:
        safe = max(1, math.floor(safe * ema_headroom + _EPS))
    return safe


def choose_batch(fits: Callable[[int], bool], *, target_effective: int, world_size: int, use_ema: bool,
                 ema_headroom: float) -> AutoBatch:
    """Per-device batch and the accumulation that reaches `target_effective` images per optimizer
    step over `world_size` processes (at least one micro-batch per step)."""
    max_fitting, probed = largest_fitting(fits)
    batch_size = safe_batch(max_fitting, use_ema, ema_headroom)
    per_device = math.ceil(target_effective / world_size)
    accumulation = max(1, math.ceil(per_device / batch_size))
    return AutoBatch(batch_size, accumulation, max_fitting, tuple(probed))


def synthetic_batch(batch_size: int, side: int, num_channels: int, boxes_per_image: int,
                    device: torch.device, with_masks: bool = False) -> Batch:
    """Random square images, each with `boxes_per_image` identical boxes of class 0 and, for a
    segmentation model, their masks (one tensor shared by the images)."""
    pixels = torch.randn(batch_size, num_channels, side, side, device=device)  # (B, C, S, S)
    boxes = torch.tensor([[0.5, 0.5, 0.5, 0.5]], device=device).expand(boxes_per_image, 4)  # (N, 4) cxcywh
    labels = torch.zeros(boxes_per_image, dtype=torch.long, device=device)
    masks = None
    if with_masks:
        masks = torch.zeros(boxes_per_image, side, side, dtype=torch.bool, device=device)  # (N, S, S), the box filled
        masks[:, side // 4:side - side // 4, side // 4:side - side // 4] = True
    targets = [Target(boxes, labels, image_id=i, orig_size=(side, side), size=(side, side), masks=masks)
               for i in range(batch_size)]
    return Batch(pixels, None, targets)


class MemoryProbe:
    """Training steps on synthetic batches, leaving the detector's weights, buffers and grads as
    they were. AdamW steps a shadow copy of the trainable parameters (zeros), so that the
    optimizer state is allocated as in the real run while the real weights stay put."""

    def __init__(self, detector: nn.Module, criterion: Callable, side: int, num_channels: int,
                 boxes_per_image: int, autocast_dtype: torch.dtype | None, fused: bool) -> None:
        self.detector, self.criterion = detector, criterion
        self.side, self.num_channels, self.boxes_per_image = side, num_channels, boxes_per_image
        self.autocast_dtype = autocast_dtype
        self.trainable = [p for p in detector.parameters() if p.requires_grad]
        self.shadow = [torch.zeros_like(p) for p in self.trainable]
        self.optimizer = torch.optim.AdamW(self.shadow, fused=fused or None)

    def step(self, batch_size: int) -> None:
        """Forward, losses, backward and the shadow AdamW step on one batch of `batch_size`."""
        detector = self.detector
        device = next(detector.parameters()).device
        batch = synthetic_batch(batch_size, self.side, self.num_channels, self.boxes_per_image, device,
                                with_masks=detector.segmentation_head is not None)
        mode, grads = detector.training, [p.grad for p in self.trainable]
        buffers = [b.clone() for b in detector.buffers()]  # BatchNorm statistics move in training mode
        try:
            detector.train()
            for param in self.trainable:
                param.grad = None
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                outputs = detector(batch.pixels, batch.padding)
                with torch.autocast(device.type, enabled=False):  # losses in fp32, as in training_step
                    total = self.criterion(outputs, batch.targets, groups=detector.groups,
                                           image_size=batch.pixels.shape[-2:]).total
            if not torch.isfinite(total):
                raise RuntimeError(f'batch_size="auto": the probe loss on a synthetic batch of {batch_size} is '
                                   f"{total.item()}; the model is not numerically sound at this precision")
            total.backward()
            for shadow, param in zip(self.shadow, self.trainable):
                shadow.grad = param.grad  # None where the loss did not reach it, as in the real step
            self.optimizer.step()
        finally:
            for shadow, param, grad in zip(self.shadow, self.trainable, grads):
                shadow.grad, param.grad = None, grad
            with torch.no_grad():
                for buffer, saved in zip(detector.buffers(), buffers):
                    buffer.copy_(saved)
            detector.train(mode)

    def fits(self, batch_size: int) -> bool:
        """Whether a training step on `batch_size` images runs without running out of GPU memory."""
        release_memory()
        try:
            self.step(batch_size)
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            release_memory()
        return True


def release_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def probe_side(model_config: ModelConfig, train_config: TrainConfig) -> int:
    """The square side probed: the largest multi-scale training side, else the model resolution."""
    if train_config.multi_scale == "off":
        return model_config.resolution
    return max(multi_scale_sizes(model_config.resolution, model_config.block_size, train_config.expanded_scales))


def process_count(devices: int | str | list[int], num_nodes: int) -> int:
    """Training processes: GPUs per node (a count, -1 or "auto" for every visible one, indices, or
    "0,1") times nodes, as launched (torchrun's counts win, as in build_trainer)."""
    topology = launched_topology(devices, num_nodes)
    per_node = len(device_indices(topology["devices"], torch.cuda.device_count()))
    return max(1, per_node) * topology["num_nodes"]


def resolve_auto_batch(detector: nn.Module, model_config: ModelConfig, train_config: TrainConfig,
                       world_size: int) -> TrainConfig:
    """`train_config` with batch_size="auto" replaced by the probed per-device batch and the
    grad_accum_steps that reach auto_batch_target_effective images over `world_size` processes."""
    _require_cuda(detector, train_config)
    devices = launched_topology(train_config.devices, train_config.num_nodes)["devices"]
    precision = resolve_precision(train_config.amp_dtype, selected_accelerators("cuda", devices))
    side = probe_side(model_config, train_config)
    probe = MemoryProbe(detector, build_criterion(model_config, train_config), side, model_config.num_channels,
                        train_config.auto_batch_max_targets_per_image, precision.autocast_dtype,
                        fused=fused_adamw_applies(model_config.fused_optimizer, "cuda", precision.lightning))
    fits = probe.fits if world_size == 1 else _agreed(probe.fits)
    try:
        choice = choose_batch(fits, target_effective=train_config.auto_batch_target_effective,
                              world_size=world_size, use_ema=train_config.use_ema,
                              ema_headroom=train_config.auto_batch_ema_headroom)
    finally:
        del probe  # the shadow weights and optimizer state
        release_memory()
    logger.info('batch_size="auto": up to %d images of %dx%d fit (%s, probed %s); training with batch_size=%d x '
                "grad_accum_steps=%d per device on %d process(es)%s", choice.max_fitting, side, side,
                precision.lightning, ", ".join(map(str, choice.probed)), choice.batch_size, choice.grad_accum_steps,
                world_size, f", EMA headroom {train_config.auto_batch_ema_headroom}" if train_config.use_ema else "")
    return train_config.model_copy(update={"batch_size": choice.batch_size,
                                           "grad_accum_steps": choice.grad_accum_steps})


def probe_device(train_config: TrainConfig, model_device: torch.device) -> torch.device:
    """This process's training GPU: under torchrun the one of its LOCAL_RANK, else the configured one."""
    device = torch.device(train_config.device or model_device)
    local_rank = os.environ.get("LOCAL_RANK")
    if device.type == "cuda" and local_rank is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        return torch.device("cuda", int(local_rank))
    return device


def _agreed(fits: Callable[[int], bool]) -> Callable[[int], bool]:
    """`fits` answered by every process at once: a size fits only where it fits on every GPU, so
    all processes search the same sizes and settle on one batch (or their DDP steps would not pair).
    The process group is started here from torchrun's environment; Lightning then reuses it."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        raise RuntimeError('batch_size="auto" on several processes needs them launched by torchrun, so that '
                           "they can agree on one batch size before training; or set an integer batch_size")
    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")

    def all_fit(batch_size: int) -> bool:
        verdict = torch.tensor([int(fits(batch_size))], device="cuda")
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        return bool(verdict.item())

    return all_fit


def _require_cuda(detector: nn.Module, train_config: TrainConfig) -> None:
    asked = (train_config.device or train_config.accelerator).split(":")[0].lower()
    on = next(detector.parameters()).device.type
    if on != "cuda" or asked not in ("auto", "gpu", "cuda"):
        where = on if asked in ("auto", "gpu", "cuda") else asked
        raise RuntimeError(f'batch_size="auto" needs a CUDA GPU to probe, but this run trains on {where}. Set an '
                           "integer batch_size (e.g. batch_size=4, grad_accum_steps=4 for 16 images per optimizer "
                           'step), or train on a GPU (device="cuda")')


def require_integer_batch(train_config: TrainConfig) -> None:
    """Raise if batch_size is still "auto", which only RFDETR.train() resolves."""
    if train_config.batch_size == "auto":
        raise ValueError('batch_size="auto" is resolved by RFDETR.train() only (it probes the GPU before '
                         "training); with the Lightning API give an integer batch_size, or pass the config "
                         "through detrkit.training.auto_batch.resolve_auto_batch first")
