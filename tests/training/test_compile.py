"""compile=True (spec 16.2): the static/dynamic rule, in-place compilation that keeps checkpoint
keys, parity of a compiled training step with the eager one, and the eager position-embedding resize.

Tolerance of the parity tests (fp32): loss within 1e-6 relative, gradients within 1e-6 absolute +
1e-4 relative. Eager CPU training runs oneDNN products (`detrkit.ops.linear`), the compiled graph
plain aten products fused by Inductor, so sums may be ordered differently; measured (torch 2.14,
static): the loss bit-identical, gradients at most 7.5e-8 apart (largest gradient 0.64).

The dynamic-shape test compiles two resolutions (minutes on a small CPU); it runs with
DETRKIT_SLOW=1 only.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from tiny_config import TINY

from detrkit.config import ModelConfig, TrainConfig
from detrkit.losses.criterion import build_criterion
from detrkit.models.build import build_model
from detrkit.models.vit import Embeddings
from detrkit.structures import Target
from detrkit.training.accel.compile import (
    CompileMode,
    compile_detector,
    compiled_box_cost,
    compile_mode,
    cpu_compile_decision,
    inductor_options,
    is_compiled,
)

opt_in = pytest.mark.skipif(not os.environ.get("DETRKIT_SLOW"),
                            reason="compiles for dynamic shapes (minutes); set DETRKIT_SLOW=1")
FIXED = dict(dataset_dir=None, multi_scale="off")  # fixed-resolution detection training


@pytest.mark.parametrize(("model_changes", "train_changes", "cause"), [
    ({}, {"multi_scale": "per-batch"}, "multi_scale='per-batch'"),
    ({}, {"multi_scale": "per-sample"}, "multi_scale='per-sample'"),
    ({}, {"square_resize_div_64": False}, "square_resize_div_64=False"),
    ({}, {"aug_config": {"HorizontalFlip": {"p": 0.5}}}, "aug_config"),
    ({"cuda_graphs": True}, {}, "cuda_graphs=True"),
    ({"segmentation_head": True}, {}, "segmentation_head=True"),
    ({"use_grouppose_keypoints": True}, {}, "use_grouppose_keypoints=True"),
])
def test_compile_mode_is_dynamic_when_shapes_vary(model_changes, train_changes, cause):
    mode = compile_mode(ModelConfig(**TINY, **model_changes), TrainConfig(**{**FIXED, **train_changes}))
    assert mode.dynamic
    assert cause in mode.reason and "dynamic" in mode.reason


@pytest.mark.parametrize("aug_config", [None, {}])
def test_compile_mode_is_static_for_fixed_resolution_detection(aug_config):
    mode = compile_mode(ModelConfig(**TINY), TrainConfig(**FIXED, aug_config=aug_config))
    assert not mode.dynamic
    assert "static" in mode.reason and "64 px" in mode.reason


def test_defaults_compile_dynamic():
    assert compile_mode(ModelConfig(**TINY), TrainConfig(dataset_dir=None)).dynamic  # per-batch multi-scale


def test_inductor_options():
    import torch._inductor.config as inductor_config

    options = inductor_options()
    assert options["layout_optimization"] is False
    has_option = hasattr(inductor_config.triton, "coalesce_tiling_analysis")
    assert ("triton.coalesce_tiling_analysis" in options) == has_option
    assert "triton.cudagraphs" not in options
    assert inductor_options(cuda_graph_trees=True)["triton.cudagraphs"] is True


def test_cpu_decision_gives_a_measured_reason():
    enabled, reason = cpu_compile_decision()
    assert isinstance(enabled, bool)
    assert "ms" in reason and "eager" in reason


def test_position_embedding_resize_is_an_eager_island():
    assert getattr(Embeddings._resized_position_embeddings, "_torchdynamo_disable", False)
    detector = build_model(ModelConfig(**TINY)).eval()
    with torch.no_grad():
        native = torch._dynamo.explain(detector)(torch.randn(1, 3, 64, 64))
        resized = torch._dynamo.explain(detector)(torch.randn(1, 3, 96, 96))
    torch._dynamo.reset()
    assert native.graph_break_count == 0  # the native grid never reaches the island
    # one island; the break also splits each calling frame (Embeddings ... Detector)
    assert resized.graph_break_count >= 1
    assert all("_resized_position_embeddings" in str(b.reason) for b in resized.break_reasons)


def test_compiled_box_cost_matches_a_loop_over_pairs():
    """One dynamic compile serves costs of any size; each entry is a plain L1 distance."""
    cost = compiled_box_cost()
    generator = torch.Generator().manual_seed(0)
    try:
        for queries, targets in ((12, 3), (30, 7)):
            target = torch.rand(targets, 4, generator=generator)
            pred = torch.rand(queries, targets, 4, generator=generator)  # each target's image's queries
            expected = torch.tensor([[float(sum(abs(a - b) for a, b in zip(pred[q, t].tolist(), target[t].tolist())))
                                      for t in range(targets)] for q in range(queries)])
            torch.testing.assert_close(cost(pred, target), expected, rtol=1e-6, atol=1e-6)
    finally:
        torch._dynamo.reset()


def _targets(batch: int) -> list[Target]:
    boxes = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.6, 0.3, 0.2]])
    return [Target(boxes + 0.05 * i, torch.tensor([1, 3]), i, (64, 64), (64, 64)) for i in range(batch)]


def _detector() -> torch.nn.Module:
    torch.manual_seed(0)
    detector = build_model(ModelConfig(**TINY))
    with torch.no_grad():  # no zero-initialised layer may hide a difference
        for parameter in detector.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return detector.train()


def _step(detector: torch.nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one training step (forward, criterion, backward)."""
    criterion = build_criterion(ModelConfig(**TINY), TrainConfig(**FIXED))
    detector.zero_grad(set_to_none=True)
    loss = criterion(detector(pixels), _targets(pixels.shape[0]), groups=detector.groups).total
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in detector.named_parameters() if p.grad is not None}


def _assert_same_step(eager: tuple, compiled: tuple) -> None:
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-6, atol=0)
    assert compiled[1].keys() == eager[1].keys()
    for name, grad in eager[1].items():
        torch.testing.assert_close(compiled[1][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture(scope="module")
def static_pair():
    """An eager detector, a compiled copy (static shapes) and the loss and gradients of one step each."""
    eager = _detector()
    compiled = copy.deepcopy(eager)
    keys = list(compiled.state_dict())
    assert compile_detector(compiled, CompileMode(False, "test")) is compiled
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    steps = _step(eager, pixels), _step(compiled, pixels)
    yield eager, compiled, keys, steps
    torch._dynamo.reset()


def test_compiled_training_step_matches_eager(static_pair):
    _, compiled, _, (eager_step, compiled_step) = static_pair
    assert is_compiled(compiled)
    _assert_same_step(eager_step, compiled_step)


def test_compiled_state_dict_keys_are_the_eager_ones(static_pair):
    eager, compiled, keys, _ = static_pair
    assert list(compiled.state_dict()) == keys == list(eager.state_dict())
    assert not any("_orig_mod" in key for key in keys)
    with torch.no_grad():
        compiled.class_embed.bias.add_(1.0)  # tell the compiled weights from the eager ones
    fresh = build_model(ModelConfig(**TINY))
    fresh.load_state_dict(compiled.state_dict())  # strict: same keys, same shapes
    torch.testing.assert_close(fresh.class_embed.bias, compiled.class_embed.bias, rtol=0, atol=0)
    with torch.no_grad():
        compiled.class_embed.bias.sub_(1.0)


def test_deepcopy_of_a_compiled_detector_is_eager(static_pair):
    """The EMA copy is made by deepcopy: it must run its own weights eagerly, not the live model's graph."""
    _, compiled, _, _ = static_pair
    copied = copy.deepcopy(compiled).eval()
    assert is_compiled(compiled) and not is_compiled(copied)
    with torch.no_grad():
        for parameter in copied.parameters():
            parameter.mul_(0.5)
    reference = build_model(ModelConfig(**TINY)).eval()
    reference.load_state_dict(copied.state_dict())
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():  # the copy's own weights, eagerly: bit for bit an eager model's output
        assert torch.equal(copied(pixels).pred_logits, reference(pixels).pred_logits)


@pytest.mark.slow
@opt_in
def test_dynamic_compile_trains_at_two_resolutions():
    """Per-batch multi-scale: one dynamic compile serves the native grid and a resized one (the
    bicubic resize stays eager), with eager gradients."""
    eager = _detector()
    compiled = compile_detector(copy.deepcopy(eager), CompileMode(True, "test"))
    try:
        for side in (64, 96):
            pixels = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(side))
            _assert_same_step(_step(eager, pixels), _step(compiled, pixels))
    finally:
        torch._dynamo.reset()
