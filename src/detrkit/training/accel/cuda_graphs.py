"""CUDA graph replay of the detector's training forward and backward (spec 16.3): the eager
runner of route B (one `torch.cuda.make_graphed_callables` capture per execution signature, or
Transformer Engine's capture for FP8) and the per-step marker Inductor's graph trees need (route A).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
from torch import nn

from detrkit.structures import DetectorOutput

if TYPE_CHECKING:
    from detrkit.training.accel.plan import AccelerationPlan

logger = logging.getLogger(__name__)

WARMUP_ITERATIONS = 3  # eager forward/backward passes before capture: lazy CUDA work stays out of the graph
# (module, sample arguments) -> the module with its forward replaced by graph replay
Capture = Callable[[nn.Module, tuple[torch.Tensor, ...]], nn.Module]
Signature = tuple


@dataclass(frozen=True)
class OutputLayout:
    """Where each tensor of a flattened DetectorOutput belongs: the names of its extras, the
    layouts of its auxiliary layers (None: no list) and of its encoder output (None: absent)."""

    extras: tuple[str, ...] = ()
    aux: tuple[OutputLayout, ...] | None = None
    enc: OutputLayout | None = None


def flatten_output(output: DetectorOutput) -> tuple[tuple[torch.Tensor, ...], OutputLayout]:
    """The tensors of `output` in a fixed order (logits, boxes, extras, aux layers, encoder), and
    the layout `rebuild_output` needs to put them back."""
    for name in output.extras:
        if not isinstance(output.extras[name], torch.Tensor):
            raise TypeError(f"CUDA graphs capture tensors only; the model output {name!r} is "
                            f"{type(output.extras[name]).__name__}")
    extras = tuple(sorted(output.extras))
    tensors = [output.pred_logits, output.pred_boxes, *(output.extras[name] for name in extras)]
    aux = None
    if output.aux_outputs is not None:
        flat = [flatten_output(layer) for layer in output.aux_outputs]
        aux = tuple(layout for _, layout in flat)
        tensors += [t for part, _ in flat for t in part]
    enc = None
    if output.enc_outputs is not None:
        part, enc = flatten_output(output.enc_outputs)
        tensors += part
    return tuple(tensors), OutputLayout(extras, aux, enc)


def rebuild_output(tensors: tuple[torch.Tensor, ...], layout: OutputLayout) -> DetectorOutput:
    """The DetectorOutput that `flatten_output` made `tensors` and `layout` from."""
    stream = iter(tensors)
    output = _take(stream, layout)
    if next(stream, None) is not None:
        raise ValueError("more tensors than the output layout holds")
    return output


def _take(stream: Iterator[torch.Tensor], layout: OutputLayout) -> DetectorOutput:
    logits, boxes = next(stream), next(stream)
    extras = {name: next(stream) for name in layout.extras}
    aux = None if layout.aux is None else [_take(stream, part) for part in layout.aux]
    enc = None if layout.enc is None else _take(stream, layout.enc)
    return DetectorOutput(logits, boxes, aux_outputs=aux, enc_outputs=enc, extras=extras)


def execution_signature(pixels: torch.Tensor, padding: torch.Tensor | None) -> Signature:
    """What a captured graph is specific to: shape, dtype, device and requires_grad of the
    inputs, and whether autocast is on and in which dtype."""
    device = pixels.device.type
    autocast = torch.is_autocast_enabled(device)
    return (_tensor_key(pixels), _tensor_key(padding), autocast,
            torch.get_autocast_dtype(device) if autocast else None)


def describe_signature(signature: Signature) -> str:
    pixels, padding, autocast, dtype = signature

    def tensor(key: tuple | None) -> str:
        return "none" if key is None else f"{tuple(key[0])} {str(key[1]).removeprefix('torch.')} on {key[2]}"

    mode = f"autocast {str(dtype).removeprefix('torch.')}" if autocast else "no autocast"
    return f"pixels {tensor(pixels)}, padding {tensor(padding)}, {mode}"


def _tensor_key(tensor: torch.Tensor | None) -> tuple | None:
    if tensor is None:
        return None
    return tuple(tensor.shape), tensor.dtype, tensor.device, tensor.requires_grad


class _FlatForward(nn.Module):
    """The detector's forward with tensors out: what graph capture records. Its parameters are the
    detector's, so the captured backward produces their gradients."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector
        self.layout: OutputLayout | None = None

    def forward(self, pixels: torch.Tensor, padding: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        tensors, self.layout = flatten_output(self.detector(pixels, padding))
        return tensors


def torch_capture(module: nn.Module, samples: tuple[torch.Tensor, ...]) -> nn.Module:
    """PyTorch's capture of forward and backward, for the bf16 route."""
    return torch.cuda.make_graphed_callables(module, samples, num_warmup_iters=WARMUP_ITERATIONS,
                                             allow_unused_input=True)


def transformer_engine_capture(recipe: Any) -> Capture:
    """Transformer Engine's capture (2.19 API) under the Lightning plugin's FP8 `recipe`: quantized
    weights are not cached between replays (the optimizer changes them) and the returned parameter
    gradients are clones, not views of the graph's buffers."""

    def capture(module: nn.Module, samples: tuple[torch.Tensor, ...]) -> nn.Module:
        import transformer_engine.pytorch as te

        return te.make_graphed_callables(module, samples, num_warmup_iters=WARMUP_ITERATIONS,
                                         allow_unused_input=True, enabled=True, recipe=recipe,
                                         cache_quantized_params=False, clone_param_grads_on_return=True)

    return capture


class GraphedTrainingForward:
    """Calls `detector` like its forward; in training with gradients on, through one captured CUDA
    graph per execution signature (evaluation and no-grad calls run eagerly).

    `single_signature` (Transformer Engine's route) allows one capture and needs no gradients to
    exist at capture. A plain object, not a module: the detector's checkpoint keys stay its own.
    """

    def __init__(self, detector: nn.Module, capture: Capture = torch_capture, *,
                 single_signature: bool = False) -> None:
        self.detector = detector
        self.capture = capture
        self.single_signature = single_signature
        self.graphs: dict[Signature, _FlatForward] = {}

    def __call__(self, pixels: torch.Tensor, padding: torch.Tensor | None = None) -> DetectorOutput:
        if not (self.detector.training and torch.is_grad_enabled()):
            return self.detector(pixels, padding)
        signature = execution_signature(pixels, padding)
        graphed = self.graphs.get(signature)
        if graphed is None:
            graphed = self.graphs[signature] = self._record(signature, pixels, padding)
        own_gradients(self.detector)
        args = (pixels,) if padding is None else (pixels, padding)
        return rebuild_output(graphed(*args), graphed.layout)

    def _record(self, signature: Signature, pixels: torch.Tensor, padding: torch.Tensor | None) -> _FlatForward:
        described = describe_signature(signature)
        if self.single_signature and self.graphs:
            raise RuntimeError(f"Transformer Engine CUDA graphs capture one input signature, and a second one came: "
                               f"{described} after {describe_signature(next(iter(self.graphs)))}; train with "
                               f"multi_scale=False and square_resize_div_64=True, or set cuda_graphs=False")
        if self.single_signature and any(p.grad is not None for p in self.detector.parameters()):
            raise RuntimeError("Transformer Engine CUDA graph capture needs no gradients to exist yet")
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in (pixels, padding) if t is not None)
        flat = _FlatForward(self.detector)
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # capture refuses autocast's weight-cast cache
        try:
            graphed = self.capture(flat, samples)
        except Exception as error:
            raise RuntimeError(f"CUDA graph capture failed for {described}. The CUDA state may be unusable: "
                               f"restart the process before retrying with cuda_graphs=False") from error
        finally:
            torch.set_autocast_cache_enabled(cache)
        logger.info("CUDA graph %d captured: %s", len(self.graphs) + 1, described)
        return graphed


def own_gradients(module: nn.Module) -> None:
    """Give every existing `.grad` its own memory: one adopted from the last replay is a view of
    the graph's gradient buffer, which the next replay overwrites (accumulation would lose the
    earlier micro-batches)."""
    params = [p for p in module.parameters() if p.grad is not None]
    if params:
        # one multi-tensor kernel per dtype instead of a clone per parameter
        copies = torch._foreach_mul([p.grad for p in params], 1.0)
        for param, copy in zip(params, copies):
            param.grad = copy


class CudaGraphStepMarker(pl.Callback):
    """Route A: Inductor's CUDA graph trees reuse a replay's output memory from the next step on,
    so every training and validation step starts with `cudagraph_mark_step_begin()`."""

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        torch.compiler.cudagraph_mark_step_begin()

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        torch.compiler.cudagraph_mark_step_begin()


def graphed_forward(detector: nn.Module, plan: AccelerationPlan | None,
                    precision_plugin: Any) -> GraphedTrainingForward | None:
    """The training forward the plan's eager CUDA-graph route asks for ("eager-bf16": PyTorch's
    capture; "te": Transformer Engine's, under the plugin's FP8 recipe), else None (plain eager, or
    Inductor's graphs inside the compiled model)."""
    route = plan.cuda_graphs if plan is not None else None
    if route == "eager-bf16":
        return GraphedTrainingForward(detector)
    if route == "te":
        return GraphedTrainingForward(detector, transformer_engine_capture(precision_plugin.recipe),
                                      single_signature=True)
    return None
