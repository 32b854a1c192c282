"""Compile the detector with TorchInductor for `compile=True` (spec 16.2), in place.

`compile_mode` decides static or dynamic shapes from the configs; `compile_detector` applies it
with `nn.Module.compile`, which keeps the module object, so its state_dict keys never carry
`_orig_mod.` and a deepcopy (the EMA) is an eager module. Eager islands inside the model (the
position-embedding resize in `models/vit.py`) are marked there with `torch.compiler.disable`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch import nn

from detrkit.config import ModelConfig, TrainConfig
from detrkit.losses.matcher import BoxCost, l1_box_cost


@dataclass(frozen=True)
class CompileMode:
    """dynamic: compile for symbolic input shapes; reason: the one log line that says why."""

    dynamic: bool
    reason: str


def compile_mode(model_config: ModelConfig, train_config: TrainConfig) -> CompileMode:
    """Dynamic shapes where training batches vary in shape or the graph is recorded per shape;
    static for fixed-resolution detection."""
    causes = [text for applies, text in (
        (train_config.multi_scale != "off", f"multi_scale={train_config.multi_scale!r}"),
        (not train_config.square_resize_div_64, "square_resize_div_64=False"),
        (bool(train_config.aug_config), "a custom aug_config can change image shapes"),
        (model_config.cuda_graphs, "cuda_graphs=True"),
        (model_config.segmentation_head, "segmentation_head=True"),
        (model_config.use_grouppose_keypoints, "keypoint heads (use_grouppose_keypoints=True)"),
    ) if applies]
    if causes:
        return CompileMode(True, f"compile: dynamic shapes because of {', '.join(causes)}")
    return CompileMode(False, f"compile: static shapes (fixed {model_config.resolution} px detection training)")


def inductor_options(cuda_graph_trees: bool = False) -> dict[str, object]:
    """Inductor settings for the detector: no channels-last layout rewriting (with symbolic shapes it
    fails to order strides or saves wrongly strided inputs for backward, torch 2.14), coalesce
    tiling analysis off where this torch has it, and CUDA graph trees when asked for (spec 16.3)."""
    options: dict[str, object] = {"layout_optimization": False}
    if hasattr(inductor_config.triton, "coalesce_tiling_analysis"):
        options["triton.coalesce_tiling_analysis"] = False
    if cuda_graph_trees:
        options["triton.cudagraphs"] = True
    return options


def compile_detector(detector: nn.Module, mode: CompileMode, *, cuda_graph_trees: bool = False) -> nn.Module:
    """Compile `detector`'s forward in place (lazily: kernels build on the first call) and return it.
    Parameters, buffers and their state_dict keys are unchanged."""
    torch._dynamo.config.capture_scalar_outputs = True  # a `.item()` stays in the graph, not a break
    detector.compile(dynamic=mode.dynamic, options=inductor_options(cuda_graph_trees))
    return detector


def compiled_box_cost() -> BoxCost:
    """The matcher's L1 box cost compiled for dynamic shapes, lazily, without CUDA graphs (spec 16.2):
    one fused kernel instead of a (Q, T, 4) difference tensor. Pass it as `HungarianMatcher(box_cost=...)`."""
    return torch.compile(l1_box_cost, dynamic=True, options={"triton.cudagraphs": False})


def is_compiled(module: nn.Module) -> bool:
    """True once `compile_detector` (or `nn.Module.compile`) was applied to this module."""
    return module._compiled_call_impl is not None


def cpu_compile_decision() -> tuple[bool, str]:
    """Whether compile=True compiles on the CPU, and the line to log: no, because it is slower there.

    Measured by benchmarks/compile_cpu.py (RF-DETR Nano, fp32, 2 threads of a shared Xeon, torch
    2.14, interleaved A/B medians of 7-9 repeats): a training step (forward, criterion, backward) at
    320 px, batch 2, took 1677 ms eager against 2085 ms compiled static (paired ratio median 1.23,
    1.18-1.32 but for one outlier) and 1450 ms against 2252 ms compiled dynamic (1.53, 1.49-1.59);
    inference at 384 px, batch 1, 135 ms against 142 ms static (1.01, 0.89-1.08) and 127 ms against
    138 ms dynamic (1.09, 1.07-1.10). Start-up with a cold cache: 99 s (static) and 186 s (dynamic)
    before the first training step, 27 s and 52 s before the first prediction. The matrix products
    cost the same either way (about 0.9 s of the step); Inductor's generated CPU kernels take longer
    than eager's elementwise, normalisation and reduction kernels. Eager with plain aten products
    instead of oneDNN's (`--plain-eager`) is faster than compiled too: 1543 ms against 1975 ms.
    """
    return False, ("compile=True is disabled on the CPU: measured slower there (RF-DETR Nano, 2 threads, "
                   "torch 2.14): a 320 px training step took 1677 ms eager against 2085 ms compiled, "
                   "a 384 px prediction 135 ms eager against 142 ms compiled, after 99 s of compilation")
