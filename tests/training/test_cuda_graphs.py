"""The eager CUDA-graph runner's CPU-checkable parts: the execution signature, the output flatten and
rebuild round trip, and its control flow (one capture per signature, eager evaluation, gradients
given their own memory, capture failures) through a stand-in capture; Inductor's step marker."""

import logging

import pytest
import torch
from tiny_config import TINY

from detrkit.models.build import build_model
from detrkit.structures import DetectorOutput
from detrkit.training.accel.cuda_graphs import (
    CudaGraphStepMarker,
    GraphedTrainingForward,
    OutputLayout,
    execution_signature,
    flatten_output,
    own_gradients,
    rebuild_output,
)
from detrkit.variants import RFDETRNanoConfig


def tiny_detector() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(RFDETRNanoConfig(**TINY), 0.0).train()


def pixels(size=64, batch=1, seed=0) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_flatten_and_rebuild_round_trip_of_a_detector_output():
    output = tiny_detector()(pixels())
    output.extras["pred_masks"] = torch.zeros(1, 3, 4, 4)
    tensors, layout = flatten_output(output)
    assert all(isinstance(t, torch.Tensor) for t in tensors)
    assert len(tensors) == 2 + 1 + 2 * len(output.aux_outputs) + 2
    assert tensors[0] is output.pred_logits and tensors[1] is output.pred_boxes and tensors[2] is output.extras[
        "pred_masks"]
    rebuilt = rebuild_output(tensors, layout)
    assert list(rebuilt) == list(output)
    assert rebuilt.pred_logits is output.pred_logits and rebuilt.extras["pred_masks"] is output.extras["pred_masks"]
    assert len(rebuilt.aux_outputs) == len(output.aux_outputs)
    for got, want in zip(rebuilt.aux_outputs, output.aux_outputs):
        assert got.pred_logits is want.pred_logits and got.pred_boxes is want.pred_boxes
    assert rebuilt.enc_outputs.pred_boxes is output.enc_outputs.pred_boxes
    assert rebuilt.enc_outputs.aux_outputs is None


def test_layouts_of_bare_outputs():
    bare = DetectorOutput(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    tensors, layout = flatten_output(bare)
    assert len(tensors) == 2 and layout == OutputLayout()
    rebuilt = rebuild_output(tensors, layout)
    assert rebuilt.aux_outputs is None and rebuilt.enc_outputs is None and rebuilt.extras == {}
    empty_aux = DetectorOutput(torch.zeros(1), torch.zeros(1), aux_outputs=[])
    assert rebuild_output(*flatten_output(empty_aux)).aux_outputs == []
    with pytest.raises(ValueError, match="more tensors"):
        rebuild_output(tensors + (torch.zeros(1),), layout)
    with pytest.raises(TypeError, match="capture tensors only.*'note' is str"):
        flatten_output(DetectorOutput(torch.zeros(1), torch.zeros(1), extras={"note": "x"}))


def test_execution_signature_tells_apart_what_a_graph_depends_on():
    x = pixels()
    mask = torch.zeros(1, 64, 64, dtype=torch.bool)
    base = execution_signature(x, None)
    assert base == execution_signature(pixels(seed=5), None)  # values do not matter
    different = [
        execution_signature(pixels(size=32), None),
        execution_signature(pixels(batch=2), None),
        execution_signature(x.double(), None),
        execution_signature(x.clone().requires_grad_(), None),
        execution_signature(x, mask),
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        different.append(execution_signature(x, None))
    with torch.autocast("cpu", dtype=torch.float16):
        different.append(execution_signature(x, None))
    assert len({base, *different}) == len(different) + 1
    assert execution_signature(x, mask) != execution_signature(x, mask[:, :32])


class StandIn:
    """A capture that records what it saw and returns the module itself (runs eagerly)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls, self.fail = [], fail

    def __call__(self, module, samples):
        self.calls.append((tuple(s.shape for s in samples), torch.is_autocast_cache_enabled(),
                           all(s.data_ptr() != 0 for s in samples)))
        if self.fail is not None:
            raise self.fail
        module(*samples)  # records the output layout, as warm-up would
        return module


def test_runner_captures_once_per_signature_and_matches_eager(caplog):
    detector, capture = tiny_detector(), StandIn()
    runner = GraphedTrainingForward(detector, capture)
    with caplog.at_level(logging.INFO, logger="detrkit.training.accel.cuda_graphs"):
        for x in (pixels(seed=1), pixels(seed=2), pixels(32, seed=3), pixels(seed=4)):
            got, want = runner(x), detector(x)
            torch.testing.assert_close(got.pred_logits, want.pred_logits)
            torch.testing.assert_close(got.enc_outputs.pred_boxes, want.enc_outputs.pred_boxes)
            assert len(got.aux_outputs) == len(want.aux_outputs)
    assert [shapes for shapes, _, _ in capture.calls] == [((1, 3, 64, 64),), ((1, 3, 32, 32),)]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["CUDA graph 1 captured: pixels (1, 3, 64, 64) float32 on cpu, padding none, no autocast",
                     "CUDA graph 2 captured: pixels (1, 3, 32, 32) float32 on cpu, padding none, no autocast"]


def test_runner_disables_the_autocast_cache_during_capture_only():
    capture = StandIn()
    runner = GraphedTrainingForward(tiny_detector(), capture)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_cache_enabled()
        runner(pixels())
        assert torch.is_autocast_cache_enabled()
    assert capture.calls[0][1] is False


def test_runner_leaves_evaluation_and_no_grad_calls_eager():
    detector, capture = tiny_detector(), StandIn()
    runner = GraphedTrainingForward(detector, capture)
    with torch.no_grad():
        runner(pixels())
    detector.eval()
    assert runner(pixels()).pred_logits.shape[1] == TINY["num_queries"]  # one query group: eval
    assert capture.calls == []


def test_runner_with_padding_passes_it_to_the_capture():
    capture = StandIn()
    runner = GraphedTrainingForward(tiny_detector(), capture)
    mask = torch.zeros(1, 64, 64, dtype=torch.bool)
    mask[:, :, 48:] = True
    runner(pixels(), mask)
    assert capture.calls[0][0] == ((1, 3, 64, 64), (1, 64, 64))


def test_gradients_get_their_own_memory_before_each_replay():
    detector = tiny_detector()
    detector(pixels()).pred_logits.sum().backward()
    params = [p for p in detector.parameters() if p.grad is not None]
    before = [(p.grad.data_ptr(), p.grad.clone()) for p in params]
    own_gradients(detector)
    for p, (pointer, value) in zip(params, before):
        assert p.grad.data_ptr() != pointer
        assert torch.equal(p.grad, value)
    runner = GraphedTrainingForward(detector, StandIn())
    pointers = [p.grad.data_ptr() for p in params]
    runner(pixels())
    assert all(p.grad.data_ptr() != pointer for p, pointer in zip(params, pointers))


def test_capture_failure_stops_with_the_original_exception():
    original = RuntimeError("operation not permitted when stream is capturing")
    runner = GraphedTrainingForward(tiny_detector(), StandIn(fail=original))
    with pytest.raises(RuntimeError, match="CUDA graph capture failed for pixels .*restart the process") as caught:
        runner(pixels())
    assert caught.value.__cause__ is original
    assert torch.is_autocast_cache_enabled()


def test_single_signature_route_refuses_a_second_shape_and_existing_gradients():
    detector = tiny_detector()
    runner = GraphedTrainingForward(detector, StandIn(), single_signature=True)
    runner(pixels())
    runner(pixels(seed=3))
    with pytest.raises(RuntimeError, match=r"capture one input signature.*\(1, 3, 32, 32\).*multi_scale=False"):
        runner(pixels(32))
    detector(pixels()).pred_logits.sum().backward()
    with pytest.raises(RuntimeError, match="needs no gradients to exist"):
        GraphedTrainingForward(detector, StandIn(), single_signature=True)(pixels())


def test_step_marker_marks_training_and_validation_steps(monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    marker = CudaGraphStepMarker()
    marker.on_train_batch_start(None, None, None, 0)
    marker.on_validation_batch_start(None, None, None, 0)
    assert len(marks) == 2
