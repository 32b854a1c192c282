"""Comparing float32 results with values computed on another machine.

The reference values in tests/data were computed once, on one CPU. PyTorch picks its vectorised
kernels (exp, log, matrix products) by the instruction set of the CPU it runs on, so the same
float32 arithmetic can round the last bit differently elsewhere. Results are therefore compared
within a few float32 ulps of the tensor's largest finite magnitude, with non-finite entries equal
exactly; matches, counts and random streams stay exact.
"""

from __future__ import annotations

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps


def assert_within_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 4, label: object = "") -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, label
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite), label
    assert torch.equal(actual[~finite], expected[~finite]) or bool(torch.isnan(expected[~finite]).all()), label
    if finite.any():
        scale = expected[finite].abs().max().double().clamp_min(torch.finfo(torch.float32).tiny)
        error = (actual[finite].double() - expected[finite].double()).abs().max()
        assert error <= ulps * FLOAT32_EPS * scale, (label, float(error / (FLOAT32_EPS * scale)), "ulps")
