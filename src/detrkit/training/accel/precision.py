"""Resolve `amp_dtype` to one Lightning precision for the devices a run trains on (spec 12.7)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import pytorch_lightning as pl
import torch

from detrkit.training.accel.fp8 import FP8_BACKENDS

logger = logging.getLogger(__name__)

# Lightning precision -> the dtype autocast runs the model in (None: no autocast)
# (Transformer Engine: its plugin's fallback autocast for what does not run in FP8)
_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "32-true": None,
             "transformer-engine": torch.bfloat16}
# Lightning precisions under which AdamW may run fused on CUDA (spec 16.6): no gradient scaler
_FUSED_ADAMW_PRECISIONS = ("bf16-mixed", "bf16-true", "bf16", "transformer-engine")
FP8_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada, Hopper and newer
_FP8_CAPABILITY_TEXT = "%d.%d" % FP8_CAPABILITY


@dataclass(frozen=True)
class Accelerators:
    """What a run trains on: the device kind ("cuda", "mps", "cpu") and, for CUDA, the name and
    compute capability of every selected GPU."""

    kind: str
    names: tuple[str, ...] = ()
    capabilities: tuple[tuple[int, int], ...] = ()
    rocm: bool = False

    @property
    def native_bf16(self) -> bool:
        return self.kind == "cuda" and (self.rocm or all(c >= (8, 0) for c in self.capabilities))

    def describe(self) -> str:
        if self.kind != "cuda":
            return self.kind.upper()
        counts: dict[str, int] = {}
        for name in self.names:
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{count}× {name}" for name, count in counts.items())


@dataclass(frozen=True)
class ResolvedPrecision:
    """lightning: the Trainer's `precision`; autocast_dtype: what autocast computes in (None: fp32)."""

    lightning: str
    autocast_dtype: torch.dtype | None
    accelerators: Accelerators

    def describe(self) -> str:
        """The train-start line, e.g. "precision: bf16-mixed on 1× NVIDIA H200"."""
        return f"precision: {self.lightning} on {self.accelerators.describe()}"

    def fused_adamw(self, requested: bool = True) -> bool:
        """Whether AdamW runs fused under this precision (see `fused_adamw_applies`)."""
        return fused_adamw_applies(requested, self.accelerators.kind, self.lightning)


def fused_adamw_applies(requested: bool, device_type: str, precision: str) -> bool:
    """Fused AdamW (spec 16.6): when asked for (`fused_optimizer`), on CUDA, in a precision without
    gradient scaling (bf16): a scaler would unscale inside the fused step, before clipping could.
    Beyond the reference, also on the CPU in fp32 (no scaler either), where the fused step is about
    6x faster than the per-tensor one and equal to 3e-8."""
    if device_type == "cpu":
        return requested and str(precision) in ("32-true", "32")
    return requested and device_type == "cuda" and str(precision) in _FUSED_ADAMW_PRECISIONS


def resolve_precision(amp_dtype: str, accelerators: Accelerators,
                      fp8_backend: str = "transformer-engine") -> ResolvedPrecision:
    """The Lightning precision for `amp_dtype` ("auto", "bf16", "fp16", "fp32", "fp8") on these
    devices. CPU (and anything but CUDA or MPS) trains in fp32; CUDA takes bf16-mixed where every
    GPU has native bf16, else fp16-mixed with loss scaling; MPS takes fp16-mixed. fp8 needs GPUs
    of compute capability 8.9 or newer and runs under its backend's precision (`FP8_BACKENDS`:
    "transformer-engine" for Transformer Engine, "bf16-mixed" for torchao)."""
    kind = accelerators.kind
    if amp_dtype == "fp8":
        require_fp8_devices(accelerators)
        return _resolved(FP8_BACKENDS[fp8_backend].lightning_precision, accelerators)
    if amp_dtype == "fp32" or kind not in ("cuda", "mps"):
        if amp_dtype not in ("auto", "fp32"):
            logger.info("amp_dtype=%r applies to GPUs only; training on %s runs in fp32", amp_dtype, kind)
        return _resolved("32-true", accelerators)
    if kind == "mps":
        if amp_dtype == "bf16":
            warnings.warn("amp_dtype='bf16' is not supported on MPS; training in fp16-mixed", UserWarning, stacklevel=2)
        return _resolved("16-mixed", accelerators)
    if amp_dtype == "fp16":
        return _resolved("16-mixed", accelerators)
    if accelerators.native_bf16:
        return _resolved("bf16-mixed", accelerators)
    if amp_dtype == "bf16":
        warnings.warn(f"amp_dtype='bf16' needs GPUs with native bf16 (compute capability 8.0 or newer); "
                      f"{accelerators.describe()} lacks it, so training runs in fp16-mixed with loss scaling",
                      UserWarning, stacklevel=2)
    return _resolved("16-mixed", accelerators)


def require_fp8_devices(accelerators: Accelerators) -> None:
    """FP8 trains on NVIDIA GPUs of compute capability 8.9 or newer (Ada, Hopper, Blackwell), every
    selected one: ValueError naming what this run has instead."""
    if accelerators.kind != "cuda":
        raise ValueError(f"amp_dtype='fp8' needs NVIDIA GPUs of compute capability {_FP8_CAPABILITY_TEXT} or "
                         f"newer, not {accelerators.kind.upper()}; use amp_dtype='auto' there")
    lacking = [f"{name} ({major}.{minor})" for name, (major, minor)
               in zip(accelerators.names, accelerators.capabilities) if (major, minor) < FP8_CAPABILITY]
    if lacking:
        raise ValueError(f"amp_dtype='fp8' needs compute capability {_FP8_CAPABILITY_TEXT} or newer on every "
                         f"selected GPU; {', '.join(lacking)} lack{'s' if len(lacking) == 1 else ''} it: use "
                         f"amp_dtype='bf16' or select other GPUs with devices=")


def _resolved(lightning: str, accelerators: Accelerators) -> ResolvedPrecision:
    return ResolvedPrecision(lightning, _AUTOCAST[lightning], accelerators)


def selected_accelerators(accelerator: str, devices: int | str | list[int]) -> Accelerators:
    """The devices Lightning will train on for `accelerator` ("auto", "gpu", "cuda", "cpu", ...)
    and `devices` (a count, indices, "auto", or "0,1"), read from this machine."""
    accelerator = accelerator.lower()
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        available = torch.cuda.device_count()
        indices = [i for i in device_indices(devices, available) if i < available] or [0]
        return Accelerators("cuda", tuple(torch.cuda.get_device_name(i) for i in indices),
                            tuple(torch.cuda.get_device_capability(i) for i in indices),
                            rocm=torch.version.hip is not None)
    mps = getattr(torch.backends, "mps", None)
    if accelerator in ("auto", "gpu", "mps") and mps is not None and mps.is_available():
        return Accelerators("mps")
    return Accelerators("cpu" if accelerator in ("auto", "gpu", "cuda", "mps") else accelerator)


def device_indices(devices: int | str | list[int], available: int) -> list[int]:
    """Device indices Lightning selects from `devices`: a count n takes the first n (-1 or "auto":
    all `available`), a list or "0,2" names them."""
    if isinstance(devices, str):
        devices = devices.strip()
        if devices in ("auto", "-1"):
            devices = -1
        elif "," in devices:
            devices = [int(part) for part in devices.split(",") if part.strip()]
        else:
            devices = int(devices)
    if isinstance(devices, int):
        return list(range(available if devices == -1 else devices))
    return list(devices)


class TensorFloat32(pl.Callback):
    """TF32 for the fp32 matrix products of CUDA training (the parts autocast leaves in fp32), for
    the length of fit only: fp32 predict() afterwards stays strict fp32. Lightning only warns."""

    def __init__(self) -> None:
        self._before: str | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            self._before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("high")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._before is not None:
            torch.set_float32_matmul_precision(self._before)
            self._before = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.on_fit_end(trainer, pl_module)
