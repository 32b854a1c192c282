"""The acceleration plan (spec 16.2, 16.3, 12.7): compile, both CUDA-graph routes with each fallback
message and train-start error in the spec's order, and FP8's rules and backend choice, from
hand-made device facts (no GPU needed)."""

import logging
import re

import pytest
from pydantic import ValidationError
from tiny_config import TINY

from detrkit.config import ModelConfig, TrainConfig
from detrkit.training.accel.compile import cpu_compile_decision
from detrkit.training.accel.plan import DeviceFacts, log_plan, plan_acceleration, read_device_facts
from detrkit.training.accel.precision import Accelerators

H200 = Accelerators("cuda", ("NVIDIA H200",), ((9, 0),))
TWO_H200 = Accelerators("cuda", ("NVIDIA H200",) * 2, ((9, 0),) * 2)
T4 = Accelerators("cuda", ("Tesla T4",), ((7, 5),))
CPU = Accelerators("cpu")
TE = dict(precision="transformer-engine", te_version="2.19.0", te_error="", te_graph_api=True)
FIXED = dict(multi_scale=False, square_resize_div_64=True)


def model(**changes) -> ModelConfig:
    return ModelConfig(**TINY).model_copy(update=changes)  # unvalidated: heads need not be buildable


def train(**changes) -> TrainConfig:
    fields = {k: v for k, v in changes.items() if k in TrainConfig.model_fields}
    config = TrainConfig(dataset_dir=None, **fields)
    return config.model_copy(update={k: v for k, v in changes.items() if k not in fields})


def facts(**changes) -> DeviceFacts:
    return DeviceFacts(**{"accelerators": H200, "precision": "bf16-mixed", **changes})


def texts(plan, level=None) -> list[str]:
    return [text for lvl, text in plan.messages if level is None or lvl == level]


# ---- compile (16.2)

def test_compile_runs_on_cuda_only():
    assert plan_acceleration(model(compile=True), train(), facts()).compile
    assert not plan_acceleration(model(compile=False), train(), facts()).compile
    on_cpu = plan_acceleration(model(compile=True), train(), facts(accelerators=CPU, precision="32-true"))
    assert not on_cpu.compile
    assert texts(on_cpu) == [cpu_compile_decision()[1]]
    assert texts(on_cpu)[0].startswith("compile=True is disabled on the CPU: measured slower there")


def test_plain_runs_have_nothing_to_say():
    plan = plan_acceleration(model(), train(), facts())
    assert (plan.compile, plan.cuda_graphs, plan.fp8_backend, plan.messages) == (False, None, None, ())


# ---- route A: compile=True + cuda_graphs (16.3)

def test_route_a_when_nothing_stands_in_the_way():
    plan = plan_acceleration(model(compile=True, cuda_graphs=True), train(), facts())
    assert (plan.compile, plan.cuda_graphs) == (True, "inductor")
    assert texts(plan, logging.INFO) == ["CUDA graphs: Inductor CUDA graph trees record the compiled model once per "
                                         "input shape (compile=True); the eager CUDA-graph runner stays off"]


@pytest.mark.parametrize(("model_changes", "train_changes", "fact_changes", "reason"), [
    ({}, {}, {"mark_step_begin": False}, r"torch .* lacks torch.compiler.cudagraph_mark_step_begin"),
    ({}, {"amp_dtype": "fp8"}, TE, r"amp_dtype='fp8' is set \(FP8 layers are not recorded by Inductor's CUDA graphs\)"),
    ({"segmentation_head": True}, {}, {}, r"segmentation_head=True"),
    ({"use_grouppose_keypoints": True}, {}, {}, r"the model has keypoint heads \(use_grouppose_keypoints=True\)"),
    ({"gradient_checkpointing": True}, {}, {}, r"gradient_checkpointing=True"),
    ({}, {"grad_accum_steps": 2}, {"accumulate_grad_batches": 2},
     r"grad_accum_steps=2 \(the graph pool would overwrite the gradients of earlier micro-batches\)"),
    ({}, {"devices": 2}, {"devices": 2, "world_size": 2}, r"training is multi-device \(devices=2, num_nodes=1\)"),
    ({}, {"devices": "0,1"}, {"devices": "0,1", "world_size": 2},
     r"training is multi-device \(devices='0,1', num_nodes=1\)"),
    ({}, {"devices": [0, 1]}, {"devices": [0, 1], "world_size": 2},
     r"training is multi-device \(devices=\[0, 1\], num_nodes=1\)"),
    ({}, {"num_nodes": 2}, {"num_nodes": 2, "world_size": 2}, r"training is multi-device \(devices=1, num_nodes=2\)"),
])
def test_route_a_falls_back_to_compile_only(model_changes, train_changes, fact_changes, reason):
    plan = plan_acceleration(model(compile=True, cuda_graphs=True, **model_changes), train(**train_changes),
                             facts(**fact_changes))
    assert (plan.compile, plan.cuda_graphs) == (True, None)
    [warning] = texts(plan, logging.WARNING)
    assert re.fullmatch("Falling back to compile-only because " + reason, warning), warning
    assert texts(plan, logging.INFO)[-1].endswith("training remains compile-only")


def test_route_a_reports_the_first_reason_in_the_spec_order():
    plan = plan_acceleration(model(compile=True, cuda_graphs=True, segmentation_head=True, gradient_checkpointing=True),
                             train(grad_accum_steps=4), facts(mark_step_begin=False, accumulate_grad_batches=4))
    [warning] = texts(plan, logging.WARNING)
    assert "cudagraph_mark_step_begin" in warning
    plan = plan_acceleration(model(compile=True, cuda_graphs=True, use_grouppose_keypoints=True,
                                   gradient_checkpointing=True), train(), facts())
    assert texts(plan, logging.WARNING) == ["Falling back to compile-only because the model has keypoint heads "
                                            "(use_grouppose_keypoints=True)"]


@pytest.mark.parametrize("devices", ["auto", "1", 1, [0]])
def test_route_a_takes_one_device_as_single(devices):
    plan = plan_acceleration(model(compile=True, cuda_graphs=True), train(devices=devices), facts(devices=devices))
    assert plan.cuda_graphs == "inductor"


@pytest.mark.parametrize(("fact_changes", "match"), [
    ({"accumulate_grad_batches": 2}, r"cannot accumulate gradients, but the Trainer runs accumulate_grad_batches=2"),
    ({"devices": "auto", "world_size": 4, "accelerators": Accelerators("cuda", ("NVIDIA H200",) * 4, ((9, 0),) * 4)},
     r"runs in one process, but the Trainer starts 4 \(devices='auto', num_nodes=1\)"),
    ({"precision": "transformer-engine"}, r"Trainer runs precision='transformer-engine'"),
])
def test_route_a_stops_at_train_start_when_the_trainer_contradicts_it(fact_changes, match):
    with pytest.raises(RuntimeError, match=match):
        plan_acceleration(model(compile=True, cuda_graphs=True), train(devices="auto"), facts(**fact_changes))


def test_route_a_off_cuda_disables_graphs_with_a_warning():
    plan = plan_acceleration(model(compile=True, cuda_graphs=True), train(),
                             facts(accelerators=CPU, precision="32-true"))
    assert (plan.compile, plan.cuda_graphs) == (False, None)
    assert texts(plan, logging.WARNING) == ["Disabling CUDA graphs because the model is not on CUDA (this run trains "
                                            "on CPU); training will run eagerly"]


# ---- route B: compile=False + cuda_graphs (16.3)

@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_route_b_captures_bf16(precision):
    plan = plan_acceleration(model(cuda_graphs=True), train(), facts(precision=precision))
    assert (plan.compile, plan.cuda_graphs) == (False, "eager-bf16")
    assert texts(plan) == ["CUDA graphs: the training forward and backward replay one captured graph per input "
                           "signature (batch size, resolution, dtype, autocast)"]


ROUTE_B_REASONS = [
    ({}, {}, {"accelerators": CPU, "precision": "32-true"}, "the model is not on CUDA (this run trains on CPU)"),
    ({}, {}, {"accelerators": TWO_H200, "devices": 2, "world_size": 2},
     "the world size is 2, not 1 (devices=2, num_nodes=1)"),
    ({"segmentation_head": True}, {}, {}, "segmentation_head=True"),
    ({"use_grouppose_keypoints": True}, {}, {}, "the model has keypoint heads (use_grouppose_keypoints=True)"),
    ({"gradient_checkpointing": True}, {}, {}, "gradient_checkpointing=True"),
    ({}, {"amp_dtype": "fp8", "multi_scale": False, "square_resize_div_64": False}, TE,
     "Transformer Engine capture needs square_resize_div_64=True"),
    ({}, {"amp_dtype": "fp8"}, TE, "Transformer Engine capture needs one input shape (multi_scale=False), "
                                   "not multi_scale='per-batch'"),
    ({}, {"amp_dtype": "fp8", "grad_accum_steps": 2, **FIXED}, {**TE, "accumulate_grad_batches": 2},
     "Transformer Engine capture needs accumulate_grad_batches=1, not 2"),
    ({}, {"amp_dtype": "fp8", "fp8_backend": "torchao"}, {"torchao": True},
     "amp_dtype='fp8' with torchao's float8 layers is not captured"),
    ({}, {}, {"precision": "16-mixed"}, "precision is 16-mixed, not bf16-mixed or bf16-true (fp16 and fp32 are not "
                                        "captured)"),
    ({}, {}, {"precision": "32-true"}, "precision is 32-true, not bf16-mixed or bf16-true (fp16 and fp32 are not "
                                       "captured)"),
]


@pytest.mark.parametrize(("model_changes", "train_changes", "fact_changes", "reason"), ROUTE_B_REASONS)
def test_route_b_falls_back_to_eager(model_changes, train_changes, fact_changes, reason):
    plan = plan_acceleration(model(cuda_graphs=True, **model_changes), train(**train_changes), facts(**fact_changes))
    assert plan.cuda_graphs is None
    assert texts(plan, logging.WARNING) == [f"Disabling CUDA graphs because {reason}; training will run eagerly"]


def test_route_b_reports_the_first_reason_in_the_spec_order():
    plan = plan_acceleration(model(cuda_graphs=True, segmentation_head=True, gradient_checkpointing=True), train(),
                             facts(precision="16-mixed"))
    assert texts(plan, logging.WARNING) == ["Disabling CUDA graphs because segmentation_head=True; training will "
                                            "run eagerly"]
    plan = plan_acceleration(model(cuda_graphs=True, gradient_checkpointing=True), train(),
                             facts(accelerators=TWO_H200, devices=2, world_size=2))
    assert "the world size is 2" in texts(plan, logging.WARNING)[0]


def test_route_b_with_transformer_engine_takes_the_te_capture():
    plan = plan_acceleration(model(cuda_graphs=True), train(amp_dtype="fp8", **FIXED), facts(**TE))
    assert (plan.cuda_graphs, plan.fp8_backend, plan.precision) == ("te", "transformer-engine", "transformer-engine")
    assert "CUDA graphs: Transformer Engine 2.19.0 captures the FP8 training forward and backward for one fixed " \
           "input shape" in texts(plan)


def test_te_capture_needs_the_graph_api_and_transformer_engine():
    with pytest.raises(RuntimeError, match="clone_param_grads_on_return.*2.18.0 does not"):
        plan_acceleration(model(cuda_graphs=True), train(amp_dtype="fp8", **FIXED),
                          facts(**{**TE, "te_version": "2.18.0", "te_graph_api": False}))
    with pytest.raises(RuntimeError, match=r"needs Transformer Engine, but it is not installed: pip install "
                                           r"\"detrkit\[cuda\]\""):  # precision given to the Trainer directly
        plan_acceleration(model(cuda_graphs=True), train(**FIXED), facts(precision="transformer-engine"))


def test_fp8_with_compile_and_graphs_stays_compile_only():
    plan = plan_acceleration(model(compile=True, cuda_graphs=True), train(amp_dtype="fp8", **FIXED), facts(**TE))
    assert (plan.compile, plan.cuda_graphs, plan.fp8_backend) == (True, None, "transformer-engine")
    assert any("training remains compile-only" in text for text in texts(plan))


# ---- FP8 (12.7 and the FP8 page)

@pytest.mark.parametrize("kind", ["cpu", "mps", "tpu", "xla"])
def test_fp8_needs_nvidia_gpus(kind):
    with pytest.raises(ValueError, match=f"amp_dtype='fp8' needs NVIDIA GPUs of compute capability 8.9 or newer, "
                                         f"not {kind.upper()}"):
        plan_acceleration(model(), train(amp_dtype="fp8"), facts(accelerators=Accelerators(kind), **TE))


@pytest.mark.parametrize(("accelerators", "named"), [
    (T4, r"Tesla T4 \(7.5\) lacks it"),
    (Accelerators("cuda", ("NVIDIA H200", "Tesla T4"), ((9, 0), (7, 5))), r"; Tesla T4 \(7.5\) lacks it"),
    (Accelerators("cuda", ("NVIDIA A100", "NVIDIA L4", "NVIDIA A10"), ((8, 0), (8, 9), (8, 6))),
     r"NVIDIA A100 \(8.0\), NVIDIA A10 \(8.6\) lack it"),
])
def test_fp8_needs_capability_8_9_on_every_gpu(accelerators, named):
    with pytest.raises(ValueError, match="compute capability 8.9 or newer on every selected GPU.*" + named):
        plan_acceleration(model(), train(amp_dtype="fp8"), facts(accelerators=accelerators, **TE))


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_fp8_rejects_sharded_strategies(strategy):
    with pytest.raises(ValidationError, match="sharded strategies such as FSDP and DeepSpeed"):
        TrainConfig(dataset_dir=None, amp_dtype="fp8", strategy=strategy)  # the config refuses them already
    unchecked = train(amp_dtype="fp8").model_copy(update={"strategy": strategy})
    with pytest.raises(ValueError, match=f"amp_dtype='fp8' does not train with strategy='{strategy}'.*use DDP"):
        plan_acceleration(model(), unchecked, facts(**TE))


def test_fp8_needs_model_amp():
    with pytest.raises(ValueError, match="needs model AMP: the model was built with amp=False"):
        plan_acceleration(model(amp=False), train(amp_dtype="fp8"), facts(**TE))


def test_fp8_needs_an_integer_batch_size():
    with pytest.raises(ValidationError, match="explicit integer batch_size"):
        TrainConfig(dataset_dir=None, amp_dtype="fp8", batch_size="auto")


@pytest.mark.parametrize(("requested", "te", "torchao", "chosen"), [
    ("auto", True, True, "transformer-engine"), ("auto", True, False, "transformer-engine"),
    ("auto", False, True, "torchao"), ("transformer-engine", True, True, "transformer-engine"),
    ("torchao", True, True, "torchao"),
])
def test_fp8_backend_choice(requested, te, torchao, chosen):
    te_facts = {"te_version": "2.19.0", "te_error": ""} if te else {}
    precision = {"transformer-engine": "transformer-engine", "torchao": "bf16-mixed"}[chosen]
    plan = plan_acceleration(model(), train(amp_dtype="fp8", fp8_backend=requested),
                             facts(precision=precision, torchao=torchao, **te_facts))
    assert plan.fp8_backend == chosen
    [line] = texts(plan)
    assert line.startswith(f"FP8 (amp_dtype='fp8', fp8_backend={requested!r}): ")
    if chosen == "torchao":
        assert "training runs under bf16-mixed with the eligible Linear layers converted to Float8Linear" in line


@pytest.mark.parametrize(("requested", "match"), [
    ("auto", r"needs Transformer Engine or torchao, and neither imports: pip install \"detrkit\[cuda\]\" "
             r"\(Transformer Engine; it is not installed\) or pip install torchao"),
    ("transformer-engine", r"fp8_backend='transformer-engine' needs the transformer_engine.pytorch extension, but "
                           r"it is not installed: pip install \"detrkit\[cuda\]\""),
    ("torchao", r"fp8_backend='torchao' needs the torchao package: pip install torchao"),
])
def test_fp8_backend_that_does_not_import(requested, match):
    with pytest.raises(ImportError, match=match):
        plan_acceleration(model(), train(amp_dtype="fp8", fp8_backend=requested), facts(precision="bf16-mixed"))


def test_log_plan_writes_each_message_at_its_level(caplog):
    plan = plan_acceleration(model(compile=True, cuda_graphs=True, segmentation_head=True), train(), facts())
    with caplog.at_level(logging.INFO, logger="detrkit.training.accel.plan"):
        log_plan(plan)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == list(plan.messages)
    assert caplog.records[0].levelno == logging.WARNING


# ---- the facts of this machine

def test_facts_of_a_cpu_run():
    read = read_device_facts(train(grad_accum_steps=3), CPU, devices=1, num_nodes=1)
    assert (read.precision, read.world_size, read.accumulate_grad_batches) == ("32-true", 1, 3)
    assert (read.te_version, read.torchao) == (None, False)  # not probed without FP8
    given = read_device_facts(train(), CPU, devices="0,1", num_nodes=2, precision="bf16-mixed",
                              accumulate_grad_batches=2)
    assert (given.precision, given.world_size, given.accumulate_grad_batches) == ("bf16-mixed", 4, 2)
    assert read_device_facts(train(), TWO_H200, devices=2, num_nodes=1, precision="bf16-mixed").world_size == 2


def test_facts_refuse_fp8_off_cuda():
    with pytest.raises(ValueError, match="not CPU"):
        read_device_facts(train(amp_dtype="fp8"), CPU, devices=1, num_nodes=1)
