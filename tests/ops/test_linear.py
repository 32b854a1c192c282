"""Packed-weight CPU inference path against plain F.linear, and cache invalidation."""

import pytest
import torch
import torch.nn.functional as F

from detrkit.ops.linear import (Linear, PackedWeight, _OneDnnLinear, linear, onednn_training_applies, packing_applies,
                               scaled_residual_linear)



@pytest.mark.parametrize("activation, eager", [("none", lambda x: x), ("gelu", F.gelu), ("relu", F.relu)])
def test_packed_linear_matches_plain(activation, eager):
    torch.manual_seed(0)
    layer = Linear(24, 40, activation=activation)
    x = torch.randn(3, 7, 24)
    with torch.no_grad():
        assert packing_applies(x, layer.weight) == torch.backends.mkldnn.is_available()
        fast = layer(x)
    torch.testing.assert_close(fast, eager(F.linear(x, layer.weight, layer.bias)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation, eager", [("none", lambda x: x), ("gelu", F.gelu), ("relu", F.relu)])
@pytest.mark.parametrize("grads", [(True, True, True), (True, False, False), (False, True, False), (False, False, True)])
def test_training_linear_matches_f_linear_with_every_gradient(activation, eager, grads):
    torch.manual_seed(0)
    x = torch.randn(3, 70, 24, requires_grad=grads[0])
    weight = torch.randn(40, 24, requires_grad=grads[1])
    bias = torch.randn(40, requires_grad=grads[2])
    assert onednn_training_applies(x, weight) == torch.backends.mkldnn.is_available()
    out = linear(x, weight, bias, activation)
    expected = eager(F.linear(x, weight, bias))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    wanted = [t for t in (x, weight, bias) if t.requires_grad]
    upstream = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, wanted, upstream), torch.autograd.grad(expected, wanted, upstream)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_training_linear_in_float64_and_gradcheck():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    for relu in (False, True):
        assert torch.autograd.gradcheck(lambda *a: _OneDnnLinear.apply(*a, relu), (x, weight, bias))
    no_bias = _OneDnnLinear.apply(x, weight, None, True)
    torch.testing.assert_close(no_bias, F.relu(F.linear(x, weight)), rtol=0, atol=1e-12)


def test_training_linear_relu_ties_and_non_contiguous_input():
    weight = torch.ones(3, 4, requires_grad=True)
    x = torch.zeros(4, 6, requires_grad=True)  # transposed view below: every pre-activation is 0
    out = linear(x.t(), weight, torch.zeros(3), "relu")
    out.sum().backward()
    assert torch.count_nonzero(x.grad) == 0 and torch.count_nonzero(weight.grad) == 0
    weight.grad = None
    inputs = torch.randn(4, 6).t()  # non-contiguous
    linear(inputs, weight, None, "relu").sum().backward()  # sum(): an expanded, stride-0 upstream gradient
    torch.testing.assert_close(weight.grad, (inputs @ weight.detach().t() > 0).float().t() @ inputs)


def test_training_linear_refuses_double_backward():
    x = torch.randn(5, 4, requires_grad=True)
    weight = torch.randn(3, 4, requires_grad=True)
    (grad,) = torch.autograd.grad(linear(x, weight, None).square().sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_training_linear_paths():
    w = torch.zeros(3, 4)
    assert not onednn_training_applies(torch.zeros(0, 4), w)  # nothing to multiply
    assert not onednn_training_applies(torch.zeros(2, 4, dtype=torch.float64), w.double())
    with torch.no_grad():
        assert not onednn_training_applies(torch.zeros(2, 4), w)  # inference: the packed path


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


def test_flop_counters_see_the_plain_products():
    from torch.utils.flop_counter import FlopCounterMode

    from detrkit.models.mlp import MLP

    layer, mlp = Linear(24, 40, activation="relu"), MLP(8, 16, 4, 2)
    x, rows = torch.randn(5, 24, requires_grad=True), torch.randn(3000, 8, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        assert not onednn_training_applies(x, layer.weight)
        (layer(x).sum() + mlp(rows).sum()).backward()
        with torch.no_grad():
            assert not packing_applies(x, layer.weight)
    forward = 2 * 5 * 24 * 40 + 2 * 3000 * (8 * 16 + 16 * 4)
    # backward: a weight gradient for every layer, an input gradient for all but the MLP's first
    # layer's input (rows), which needs one too: 3x the forward products in all
    assert counter.get_total_flops() == 3 * forward
    assert onednn_training_applies(x, layer.weight) == torch.backends.mkldnn.is_available()
