"""FP8 training backends (amp_dtype="fp8"): their registry and the layer swaps that give a detector
FP8 matrix products, Transformer Engine's or torchao's, with the same checkpoint keys.

Both backends replace eligible `nn.Linear` layers (`fp8_eligible`) before fit; everything else
stays in bf16. A detrkit `Linear` may carry a fused activation (ReLU in the decoder FFN and the box
MLPs, GELU in the ViT MLP): the replacement keeps it, which Lightning's own Transformer Engine
layer swap would not, so the Transformer Engine plugin runs with `replace_layers=False`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

# output layers whose values are read directly (class logits, box deltas) or steer where
# deformable attention samples; FP8's 3-bit mantissa would move detections, so they stay bf16
HIGH_PRECISION_LAYERS = frozenset({
    "class_embed", "bbox_embed", "enc_out_class_embed", "enc_out_bbox_embed",
    "sampling_offsets", "attention_weights", "ref_point_head",
})
FP8_MULTIPLE = 16  # FP8 GEMMs need both weight dimensions divisible by 16
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "gelu": F.gelu}


@dataclass(frozen=True)
class FP8Conversion:
    """Which Linear layers compute in FP8 (`converted`) and which stay bf16 (`kept`), by name."""

    backend: str
    converted: tuple[str, ...]
    kept: tuple[str, ...]

    def describe(self) -> str:
        return (f"FP8 ({self.backend}): {len(self.converted)} Linear layers compute in FP8, {len(self.kept)} stay "
                f"bf16 (output heads, sampling offsets, dimensions not multiples of {FP8_MULTIPLE})")


@dataclass(frozen=True)
class FP8Backend:
    """One way to train in FP8.

    lightning_precision: the Trainer precision it runs under; install: the command providing it;
    module: what must import for it to work; summary: the plan's log line; convert: the layer swap
    applied to the detector before fit; plugin: the Lightning precision plugin to pass instead of
    the precision string (None: pass `lightning_precision`).
    """

    name: str
    lightning_precision: str
    install: str
    module: str
    summary: str
    convert: Callable[[nn.Module], FP8Conversion]
    plugin: Callable[[], Any] | None = None

    def trainer_precision(self) -> dict[str, Any]:
        """The Trainer arguments selecting this precision: `precision=` or `plugins=[...]`."""
        if self.plugin is None:
            return {"precision": self.lightning_precision}
        return {"plugins": [self.plugin()]}


def fp8_eligible(module: nn.Module, name: str) -> bool:
    """Whether the layer `name` computes in FP8: a Linear with both dimensions multiples of 16
    (the FP8 GEMM's requirement), outside the output heads and sampling-offset layers."""
    if not isinstance(module, nn.Linear) or HIGH_PRECISION_LAYERS.intersection(name.split(".")):
        return False
    return module.in_features % FP8_MULTIPLE == 0 and module.out_features % FP8_MULTIPLE == 0


def ema_state_filter(name: str) -> bool:
    """Whether the state-dict entry `name` moves between the live model and its EMA copy:
    Transformer Engine's serialized `_extra_state` (FP8 scaling history) does not: loading it
    means unpickling, which TE refuses by default; weights, buffers and counters do."""
    return not name.endswith("_extra_state")


def convert_for_fp8(detector: nn.Module, *, emulate: bool = False) -> FP8Conversion:
    """torchao float8 training: swap the eligible Linear layers for `Float8Linear` (dynamic
    tensorwise scaling) in place, keeping their parameters, names and fused activations.
    `emulate=True` computes the FP8 products in high precision (for CPU tests)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    activations: dict[str, str] = {}

    def eligible(module: nn.Module, name: str) -> bool:
        if fp8_eligible(module, name):
            activations[name] = _activation(module)
            return True
        return False

    kept = [name for name, module in detector.named_modules() if isinstance(module, nn.Linear)
            and not fp8_eligible(module, name)]
    convert_to_float8_training(detector, module_filter_fn=eligible, config=Float8LinearConfig(emulate=emulate))
    for name, activation in activations.items():
        if activation != "none":
            _add_activation(detector.get_submodule(name), Float8Linear, activation)
    return FP8Conversion("torchao", tuple(activations), tuple(kept))


def convert_for_transformer_engine(detector: nn.Module) -> FP8Conversion:
    """Transformer Engine: swap the eligible Linear layers for `te.Linear` in place (same names
    and weights, on the same device, fused activations kept). Their FP8 products run inside the
    Lightning plugin's `fp8_autocast`."""
    import transformer_engine.pytorch as te

    def build(linear: nn.Linear) -> nn.Module:
        weight = linear.weight
        replacement = te.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                params_dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            replacement.weight.copy_(weight)
            if linear.bias is not None:
                replacement.bias.copy_(linear.bias)
        activation = _activation(linear)
        if activation != "none":
            _add_activation(replacement, te.Linear, activation)
        return replacement

    return swap_linear_layers(detector, build, "transformer-engine")


def swap_linear_layers(model: nn.Module, build: Callable[[nn.Linear], nn.Module], backend: str) -> FP8Conversion:
    """Replace every `fp8_eligible` Linear of `model` by `build(linear)`; a layer reachable under
    two names is built once and set under both."""
    built: dict[int, nn.Module] = {}
    converted, kept = [], []
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(module, nn.Linear) or not name:
            continue
        if not fp8_eligible(module, name):
            kept.append(name)
            continue
        if id(module) not in built:
            built[id(module)] = build(module)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, built[id(module)])
        converted.append(name)
    return FP8Conversion(backend, tuple(converted), tuple(kept))


def revert_fp8(detector: nn.Module) -> int:
    """Swap torchao's `Float8Linear` layers back for detrkit `Linear` ones sharing their parameters
    (after fit: predict() and export run in the dtype they are asked for). Returns the count.
    Transformer Engine's layers are left as they are."""
    from torchao.float8.float8_linear import Float8Linear

    from detrkit.ops.linear import Linear

    count = 0
    for name, module in list(detector.named_modules()):
        if isinstance(module, Float8Linear):
            with torch.device("meta"):  # its parameters are replaced by the layer's own
                plain = Linear(module.in_features, module.out_features, bias=module.bias is not None,
                               activation=_activation(module))
            plain.weight, plain.bias = module.weight, module.bias
            parent, _, child = name.rpartition(".")
            setattr(detector.get_submodule(parent), child, plain)
            count += 1
    return count


def choose_fp8_backend(requested: str, transformer_engine: bool, torchao: bool) -> str:
    """The backend name for `requested` ("auto", "transformer-engine", "torchao"): "auto" takes
    Transformer Engine when it imports, else torchao (the name is returned even when its package
    is missing: the plan raises the ImportError saying what to install)."""
    if requested != "auto":
        return requested
    return "torchao" if torchao and not transformer_engine else "transformer-engine"


def _transformer_engine_plugin() -> Any:
    from pytorch_lightning.plugins.precision import TransformerEnginePrecision

    # replace_layers=False: the detector's layers were swapped by convert_for_transformer_engine
    return TransformerEnginePrecision(weights_dtype=torch.bfloat16, replace_layers=False)


FP8_BACKENDS: dict[str, FP8Backend] = {
    "transformer-engine": FP8Backend(
        "transformer-engine", "transformer-engine", 'pip install "detrkit[cuda]"', "transformer_engine.pytorch",
        "Transformer Engine through Lightning's precision plugin: eligible Linear layers compute in FP8, "
        "weights are bf16", convert_for_transformer_engine, _transformer_engine_plugin),
    "torchao": FP8Backend(
        "torchao", "bf16-mixed", "pip install torchao", "torchao.float8",
        "torchao float8 training: training runs under bf16-mixed with the eligible Linear layers converted to "
        "Float8Linear (fastest with compile=True, which fuses the scaling casts)", convert_for_fp8),
}


class _WithActivation:
    """Marks a swapped layer that applies its detrkit `Linear`'s fused activation after itself."""

    activation = "none"


@functools.cache
def _activated_class(base: type) -> type:
    """`base` (a Linear class) followed by the activation named by the instance's `activation`."""

    def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return _ACTIVATIONS[self.activation](base.forward(self, x, *args, **kwargs))

    return type(f"{base.__name__}WithActivation", (_WithActivation, base), {"forward": forward})


def _add_activation(module: nn.Module, base: type, activation: str) -> None:
    # re-classing keeps the instance (its parameters, buffers and name in the model) as it is
    module.__class__ = _activated_class(base)
    module.activation = activation


def _activation(module: nn.Module) -> str:
    """The activation a detrkit Linear fuses into itself ("none" for a plain nn.Linear)."""
    activation = getattr(module, "activation", "none")
    if activation != "none" and activation not in _ACTIVATIONS:
        raise ValueError(f"no FP8 layer for a Linear with activation {activation!r}")
    return activation


@contextlib.contextmanager
def fp8_layers(detector: nn.Module, backend: str | None) -> Iterator[None]:
    """While fit runs, the detector's eligible Linear layers compute in FP8 through `backend` (None:
    nothing changes); torchao's layers are swapped back afterwards, so predict() and export see
    plain ones. Logs which layers converted."""
    if backend is None:
        yield
        return
    logger.info(FP8_BACKENDS[backend].convert(detector).describe())
    try:
        yield
    finally:
        if backend == "torchao":
            revert_fp8(detector)
