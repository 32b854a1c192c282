"""Packed-weight CPU inference path against plain F.linear, and cache invalidation."""

import pytest
import torch
import torch.nn.functional as F

from detrkit.ops.linear import Linear, PackedWeight, linear, packing_applies, scaled_residual_linear



@pytest.mark.parametrize("activation, eager", [("none", lambda x: x), ("gelu", F.gelu), ("relu", F.relu)])
def test_packed_linear_matches_plain(activation, eager):
    torch.manual_seed(0)
    layer = Linear(24, 40, activation=activation)
    x = torch.randn(3, 7, 24)
    with torch.no_grad():
        assert packing_applies(x, layer.weight) == torch.backends.mkldnn.is_available()
        fast = layer(x)
    torch.testing.assert_close(fast, eager(F.linear(x, layer.weight, layer.bias)), atol=1e-5, rtol=1e-5)


def test_grad_mode_takes_the_plain_path_exactly():
    layer = Linear(8, 4, activation="relu")
    x = torch.randn(5, 8, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, F.relu(F.linear(x, layer.weight, layer.bias)))
    out.sum().backward()
    assert layer.weight.grad is not None


def test_cache_repacks_after_in_place_update():
    layer = Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2.0)  # an optimizer step or load_state_dict changes weights in place
        after = layer(x)
        torch.testing.assert_close(after, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        layer.load_state_dict({"weight": torch.zeros(4, 8), "bias": torch.ones(4)})
        torch.testing.assert_close(layer(x), torch.ones(2, 4))
    assert not torch.allclose(before, after)


def test_scaled_residual_matches_formula_and_follows_scale_changes():
    torch.manual_seed(0)
    x, residual = torch.randn(2, 5, 16), torch.randn(2, 5, 8)
    weight, bias, scale = torch.randn(8, 16), torch.randn(8), torch.rand(8)
    cache = PackedWeight()
    with torch.no_grad():
        for _ in range(2):
            got = scaled_residual_linear(x, residual, weight, bias, scale, cache)
            torch.testing.assert_close(got, residual + scale * F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
            scale.mul_(0.5)


def test_functional_linear_without_cache_is_plain():
    x, w, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(2)
    with torch.no_grad():
        assert torch.equal(linear(x, w, b, "relu"), F.relu(F.linear(x, w, b)))


def test_deep_copy_after_packed_inference_packs_its_own_weights():
    import copy

    layer = Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.inference_mode():
        layer(x)  # leaves a packed (opaque) weight in the cache
    clone = copy.deepcopy(layer)
    with torch.no_grad():
        clone.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(clone(x), F.linear(x, clone.weight, clone.bias))
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
