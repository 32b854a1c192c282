"""The eager CUDA-graph runner on CUDA (route B): graphed training steps of a tiny detector match
eager ones in loss and gradients across signatures, under bf16 autocast, with in-place optimizer
updates between steps and gradient accumulation over two micro-batches."""

import copy
import logging

import pytest
import torch
from tiny_config import TINY

from detrkit.models.build import build_model
from detrkit.training.accel.cuda_graphs import GraphedTrainingForward, flatten_output
from detrkit.variants import RFDETRNanoConfig

pytestmark = pytest.mark.gpu


def loss_of(output) -> torch.Tensor:
    """A smooth loss that reaches every output tensor (no matching: ties cannot flip it)."""
    tensors, _ = flatten_output(output)
    return sum(t.float().square().mean() for t in tensors)


def batch(size: int, seed: int, padded: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    pixels = torch.randn(2, 3, size, size, device="cuda", generator=generator)
    if not padded:
        return pixels, None
    padding = torch.zeros(2, size, size, dtype=torch.bool, device="cuda")
    padding[1, :, size // 2:] = True  # the second image is half as wide
    return pixels, padding


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / (want.float().norm() + 1e-12))


@pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(),
                    reason="needs a CUDA GPU with bf16")
def test_graphed_training_matches_eager(caplog):
    """Optimizer steps of micro-batches: A A (accumulated), B, A (replayed after B was captured),
    C (padding), B A (accumulated across two signatures). Tolerance: losses within 1e-3 relative,
    each parameter's gradient within 2e-2 relative (bf16 kernels with atomics in the backward)."""
    torch.manual_seed(0)
    eager = build_model(RFDETRNanoConfig(**{**TINY, "device": "cuda"}), 0.0).cuda().train()
    graphed = copy.deepcopy(eager)
    runner = GraphedTrainingForward(graphed)
    steps = [[batch(64, 1), batch(64, 2)], [batch(128, 3)], [batch(64, 4)], [batch(64, 5, padded=True)],
             [batch(128, 6), batch(64, 7)]]
    with caplog.at_level(logging.INFO, logger="detrkit.training.accel.cuda_graphs"):
        for step in steps:
            for pixels, padding in step:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    want, got = loss_of(eager(pixels, padding)), loss_of(runner(pixels, padding))
                assert float(got) == pytest.approx(float(want), rel=1e-3)
                want.backward()
                got.backward()
            for (name, p_eager), p_graphed in zip(eager.named_parameters(), graphed.parameters()):
                if p_eager.grad is None:
                    assert p_graphed.grad is None, name
                    continue
                assert relative_error(p_graphed.grad, p_eager.grad) < 2e-2, name
            with torch.no_grad():  # the same in-place update for both: replays must read the new weights
                for p_eager, p_graphed in zip(eager.parameters(), graphed.parameters()):
                    if p_eager.grad is not None:
                        p_eager.sub_(1e-2 * p_eager.grad)
                        p_graphed.sub_(1e-2 * p_graphed.grad)
            eager.zero_grad(set_to_none=True)
            graphed.zero_grad(set_to_none=True)
    assert len(runner.graphs) == 3
    assert len([r for r in caplog.records if "captured" in r.getMessage()]) == 3

    eager.eval()
    graphed.eval()
    pixels, _ = batch(64, 8)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        torch.testing.assert_close(runner(pixels).pred_logits, eager(pixels).pred_logits, rtol=2e-2, atol=2e-2)
    assert len(runner.graphs) == 3  # evaluation runs eagerly
