"""The acceleration plan of one training run: compile, the CUDA-graph route and the FP8 backend,
decided once from the configs and the device facts (spec 16.2, 16.3 and 12.7).

`plan_acceleration` is a pure function: the fallbacks it takes come back as log messages in the
plan (`log_plan` writes them), and settings that cannot work together raise before training.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from dataclasses import dataclass
from typing import Literal

import torch

from detrkit.config import ModelConfig, TrainConfig
from detrkit.training.accel.compile import cpu_compile_decision
from detrkit.training.accel.fp8 import FP8_BACKENDS, choose_fp8_backend
from detrkit.training.accel.precision import Accelerators, device_indices, require_fp8_devices, resolve_precision

logger = logging.getLogger(__name__)

CudaGraphRoute = Literal["eager-bf16", "inductor", "te"]
BF16_PRECISIONS = ("bf16-mixed", "bf16-true")  # the eager runner captures these only
TE_PRECISION = "transformer-engine"
SHARDED_STRATEGIES = ("fsdp", "deepspeed")


@dataclass(frozen=True)
class DeviceFacts:
    """What the plan depends on besides the configs, as this run resolves it.

    accelerators: the device kind and each selected GPU's name and compute capability; precision:
    the Trainer's precision; devices, num_nodes: the topology Lightning gets (after torchrun);
    world_size: processes in all; accumulate_grad_batches: as the Trainer runs it (a Trainer
    argument may override grad_accum_steps); mark_step_begin: torch has
    `torch.compiler.cudagraph_mark_step_begin`; te_version: Transformer Engine's version when
    `transformer_engine.pytorch` imports (None: it does not; te_error says why); te_graph_api: its
    `make_graphed_callables` takes `clone_param_grads_on_return`; torchao: `torchao.float8` imports.
    """

    accelerators: Accelerators
    precision: str
    devices: int | str | list[int] = 1
    num_nodes: int = 1
    world_size: int = 1
    accumulate_grad_batches: int = 1
    mark_step_begin: bool = True
    te_version: str | None = None
    te_error: str = "it is not installed"
    te_graph_api: bool = False
    torchao: bool = False


@dataclass(frozen=True)
class AccelerationPlan:
    """compile: whether the model is compiled; cuda_graphs: the capture route ("inductor": Inductor
    CUDA graph trees inside the compile, route A; "eager-bf16": the eager runner, route B; "te": the
    eager runner through Transformer Engine's capture; None: no graphs); fp8_backend: a key of
    `FP8_BACKENDS` or None; messages: (logging level, text) to log at train start."""

    compile: bool
    cuda_graphs: CudaGraphRoute | None
    fp8_backend: str | None
    precision: str
    messages: tuple[tuple[int, str], ...]


def plan_acceleration(model_config: ModelConfig, train_config: TrainConfig, facts: DeviceFacts) -> AccelerationPlan:
    """Decide compile, CUDA graphs and FP8 for this run. Raises ValueError or ImportError for FP8
    settings that cannot train and RuntimeError where the Trainer contradicts a compiled CUDA-graph
    model; every fallback is a message in the plan."""
    messages: list[tuple[int, str]] = []
    fp8 = _fp8_backend(model_config, train_config, facts, messages) if train_config.amp_dtype == "fp8" else None
    compiled = _compile(model_config, facts, messages)
    route = None
    if model_config.cuda_graphs:
        if compiled:
            route = _inductor_route(model_config, train_config, facts, messages)
        else:
            route = _eager_route(model_config, train_config, facts, fp8, messages)
    return AccelerationPlan(compiled, route, fp8, facts.precision, tuple(messages))


def log_plan(plan: AccelerationPlan) -> None:
    for level, text in plan.messages:
        logger.log(level, text)


def _compile(model_config: ModelConfig, facts: DeviceFacts, messages: list) -> bool:
    if not model_config.compile:
        return False
    if facts.accelerators.kind == "cpu":
        enabled, reason = cpu_compile_decision()
        if not enabled:
            messages.append((logging.INFO, reason))
        return enabled
    if facts.accelerators.kind != "cuda":
        messages.append((logging.INFO, f"compile=True is disabled: it only applies to CUDA training (this run "
                                       f"trains on {facts.accelerators.kind.upper()})"))
        return False
    return True


def _inductor_route(model_config: ModelConfig, train_config: TrainConfig, facts: DeviceFacts,
                    messages: list) -> CudaGraphRoute | None:
    """Route A: Inductor records the compiled model's graphs; the decision is the config's."""
    reason = _first([
        (not facts.mark_step_begin, f"torch {torch.__version__} lacks torch.compiler.cudagraph_mark_step_begin"),
        (train_config.amp_dtype == "fp8", "amp_dtype='fp8' is set (FP8 layers are not recorded by Inductor's "
                                          "CUDA graphs)"),
        (model_config.segmentation_head, "segmentation_head=True"),
        (model_config.use_grouppose_keypoints, "the model has keypoint heads (use_grouppose_keypoints=True)"),
        (model_config.gradient_checkpointing, "gradient_checkpointing=True"),
        (train_config.grad_accum_steps > 1, f"grad_accum_steps={train_config.grad_accum_steps} (the graph pool "
                                            f"would overwrite the gradients of earlier micro-batches)"),
        (_multi_device(facts.devices, facts.num_nodes),
         f"training is multi-device (devices={facts.devices!r}, num_nodes={facts.num_nodes})"),
    ])
    if reason is not None:
        messages.append((logging.WARNING, f"Falling back to compile-only because {reason}"))
        messages.append((logging.INFO, "cuda_graphs=True with compile=True: the eager CUDA-graph runner stays off; "
                                       "training remains compile-only"))
        return None
    _require_single_process_graphs(facts)
    messages.append((logging.INFO, "CUDA graphs: Inductor CUDA graph trees record the compiled model once per input "
                                   "shape (compile=True); the eager CUDA-graph runner stays off"))
    return "inductor"


def _require_single_process_graphs(facts: DeviceFacts) -> None:
    """The model is compiled with graph replay by now: what the Trainer resolved must fit it."""
    fix = "set cuda_graphs=False, or keep the run to one process without gradient accumulation"
    if facts.accumulate_grad_batches > 1:
        raise RuntimeError(f"cuda_graphs=True with compile=True cannot accumulate gradients, but the Trainer runs "
                           f"accumulate_grad_batches={facts.accumulate_grad_batches}: Inductor's graph pool would "
                           f"overwrite earlier micro-batches' gradients; {fix}")
    if facts.world_size != 1:
        raise RuntimeError(f"cuda_graphs=True with compile=True runs in one process, but the Trainer starts "
                           f"{facts.world_size} (devices={facts.devices!r}, num_nodes={facts.num_nodes}); {fix}")
    if facts.precision == TE_PRECISION:
        raise RuntimeError("cuda_graphs=True with compile=True does not record Transformer Engine layers, but the "
                           "Trainer runs precision='transformer-engine'; set cuda_graphs=False or use bf16")


def _eager_route(model_config: ModelConfig, train_config: TrainConfig, facts: DeviceFacts, fp8: str | None,
                 messages: list) -> CudaGraphRoute | None:
    """Route B: the eager runner captures the training forward per signature (bf16 or TE's FP8)."""
    te = facts.precision == TE_PRECISION
    accumulation = facts.accumulate_grad_batches
    reason = _first([
        (facts.accelerators.kind != "cuda", f"the model is not on CUDA (this run trains on "
                                            f"{facts.accelerators.kind.upper()})"),
        (facts.world_size != 1, f"the world size is {facts.world_size}, not 1 (devices={facts.devices!r}, "
                                f"num_nodes={facts.num_nodes})"),
        (model_config.segmentation_head, "segmentation_head=True"),
        (model_config.use_grouppose_keypoints, "the model has keypoint heads (use_grouppose_keypoints=True)"),
        (model_config.gradient_checkpointing, "gradient_checkpointing=True"),
        (te and not train_config.square_resize_div_64, "Transformer Engine capture needs square_resize_div_64=True"),
        (te and train_config.multi_scale != "off",
         f"Transformer Engine capture needs one input shape (multi_scale=False), not "
         f"multi_scale={train_config.multi_scale!r}"),
        (te and accumulation != 1, f"Transformer Engine capture needs accumulate_grad_batches=1, not {accumulation}"),
        (fp8 == "torchao", "amp_dtype='fp8' with torchao's float8 layers is not captured"),
        (not te and facts.precision not in BF16_PRECISIONS, f"precision is {facts.precision}, not bf16-mixed or "
                                                            f"bf16-true (fp16 and fp32 are not captured)"),
    ])
    if reason is not None:
        messages.append((logging.WARNING, f"Disabling CUDA graphs because {reason}; training will run eagerly"))
        return None
    if te:
        _require_te_graph_api(facts)
        messages.append((logging.INFO, f"CUDA graphs: Transformer Engine {facts.te_version} captures the FP8 training "
                                       f"forward and backward for one fixed input shape"))
        return "te"
    messages.append((logging.INFO, "CUDA graphs: the training forward and backward replay one captured graph per "
                                   "input signature (batch size, resolution, dtype, autocast)"))
    return "eager-bf16"


def _require_te_graph_api(facts: DeviceFacts) -> None:
    if facts.te_version is None:
        raise RuntimeError(f"precision='transformer-engine' with cuda_graphs=True needs Transformer Engine, but "
                           f"{facts.te_error}: {FP8_BACKENDS['transformer-engine'].install}")
    if not facts.te_graph_api:
        raise RuntimeError(f"cuda_graphs=True with amp_dtype='fp8' needs a Transformer Engine whose "
                           f"make_graphed_callables takes clone_param_grads_on_return (2.19 was tested); "
                           f"{facts.te_version} does not: upgrade it, or set cuda_graphs=False")


def _fp8_backend(model_config: ModelConfig, train_config: TrainConfig, facts: DeviceFacts,
                 messages: list) -> str:
    """FP8's rules, in order: NVIDIA GPUs of compute capability 8.9+, no sharded strategy, model
    AMP on, and a backend that imports."""
    require_fp8_devices(facts.accelerators)
    strategy = train_config.strategy.lower()
    if any(name in strategy for name in SHARDED_STRATEGIES):
        raise ValueError(f"amp_dtype='fp8' does not train with strategy={train_config.strategy!r}: use DDP "
                         f"(strategy='ddp') for multi-GPU FP8 training")
    if not model_config.amp:
        raise ValueError("amp_dtype='fp8' needs model AMP: the model was built with amp=False; build it with "
                         "amp=True or train with amp_dtype='fp32'")
    requested = train_config.fp8_backend
    name = choose_fp8_backend(requested, facts.te_version is not None, facts.torchao)
    available = {"transformer-engine": facts.te_version is not None, "torchao": facts.torchao}
    if not available[name]:
        raise ImportError(_missing_backend(requested, name, facts))
    backend = FP8_BACKENDS[name]
    messages.append((logging.INFO, f"FP8 (amp_dtype='fp8', fp8_backend={requested!r}): {backend.summary}"))
    return name


def _missing_backend(requested: str, name: str, facts: DeviceFacts) -> str:
    te, torchao = FP8_BACKENDS["transformer-engine"], FP8_BACKENDS["torchao"]
    if requested == "auto":
        return (f"amp_dtype='fp8' needs Transformer Engine or torchao, and neither imports: {te.install} "
                f"(Transformer Engine; {facts.te_error}) or {torchao.install}")
    if name == "transformer-engine":
        return (f"fp8_backend='transformer-engine' needs the {te.module} extension, but {facts.te_error}: "
                f"{te.install}")
    return f"fp8_backend='torchao' needs the torchao package: {torchao.install}"


def _multi_device(devices: int | str | list[int], num_nodes: int) -> bool:
    """Route A's reading of the configured topology (spec 16.3)."""
    if num_nodes > 1:
        return True
    if isinstance(devices, int):
        return devices > 1
    if isinstance(devices, str):
        return devices.strip() not in ("1", "auto")
    return len(devices) > 1


def _first(reasons: list[tuple[bool, str]]) -> str | None:
    return next((text for applies, text in reasons if applies), None)


def read_device_facts(train_config: TrainConfig, accelerators: Accelerators, *, devices: int | str | list[int],
                      num_nodes: int, precision: str | None = None,
                      accumulate_grad_batches: int | None = None) -> DeviceFacts:
    """The facts of this machine and Trainer: `devices`/`num_nodes` as Lightning gets them, and a
    `precision=` or `accumulate_grad_batches=` Trainer argument where one was given. Probes
    Transformer Engine and torchao only for FP8, and resolves amp_dtype under the FP8 backend."""
    fp8 = train_config.amp_dtype == "fp8" or precision == TE_PRECISION
    te_version, te_error, te_graph_api = _probe_transformer_engine() if fp8 else (None, "it was not probed", False)
    torchao = fp8 and importlib.util.find_spec("torchao") is not None
    if precision is None:
        backend = choose_fp8_backend(train_config.fp8_backend, te_version is not None, torchao)
        precision = resolve_precision(train_config.amp_dtype, accelerators, backend).lightning
    per_node = len(accelerators.names) if accelerators.kind == "cuda" else max(1, len(device_indices(devices, 1)))
    return DeviceFacts(accelerators, str(precision), devices, num_nodes, per_node * num_nodes,
                       accumulate_grad_batches or train_config.grad_accum_steps,
                       hasattr(torch.compiler, "cudagraph_mark_step_begin"), te_version, te_error, te_graph_api,
                       torchao)


def _probe_transformer_engine() -> tuple[str | None, str, bool]:
    """(version, why it is unusable, whether its graph API clones parameter gradients)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import transformer_engine.pytorch as te
    except ImportError as error:  # the bare metapackage, a missing extension, an ABI mismatch
        return None, f"importing transformer_engine.pytorch failed ({error})", False
    try:
        found = version("transformer-engine")
    except PackageNotFoundError:
        found = getattr(te, "__version__", "unknown")
    graph_api = "clone_param_grads_on_return" in inspect.signature(te.make_graphed_callables).parameters
    return found, "", graph_api
