"""The row-chunked ReLU MLP against the plain layer-by-layer path: values and every gradient."""

import pytest
import torch

from detrkit.models.decoder import DecoderLayer
from detrkit.models.mlp import MLP
from detrkit.ops import chunked_mlp
from detrkit.ops.chunked_mlp import _ChunkedReluMLP, chunked_relu_mlp, chunking_applies, plain_relu_mlp


def _params(dtype, dims=(16, 64, 16), grads=None):
    torch.manual_seed(0)
    layers = len(dims) - 1
    grads = grads or (True,) * (1 + 2 * layers)
    shapes = [(3, 70, dims[0])] + [(b, a) for a, b in zip(dims[:-1], dims[1:])] + [(b,) for b in dims[1:]]
    tensors = [torch.randn(s, dtype=dtype, requires_grad=g) for s, g in zip(shapes, grads)]
    return tensors[0], tensors[1:1 + layers], tensors[1 + layers:]


def _chunked(x, weights, biases, chunk):
    return _ChunkedReluMLP.apply(x, chunk, len(weights), *weights, *biases)


@pytest.mark.parametrize("dims", [(16, 64, 16), (16, 8, 8, 4), (5, 7), (16, 32, 32, 32, 3)])
@pytest.mark.parametrize("chunk", [1, 16, 209, 1000])
def test_chunked_matches_plain_in_float64(dims, chunk):
    x, weights, biases = _params(torch.float64, dims)
    inputs = [x, *weights, *biases]
    out = _chunked(x, weights, biases, chunk)
    expected = plain_relu_mlp(x, weights, biases)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_gradcheck():
    x, weights, biases = _params(torch.float64, (4, 6, 5, 3))
    x = x[:, :9].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: _chunked(a[0], a[1:4], a[4:], 5), [x, *weights, *biases])


@pytest.mark.parametrize("grads", [(True, False, False, False, False), (False, True, True, True, True),
                                   (False, False, False, True, False), (False, False, True, False, False),
                                   (True, True, False, True, False)])
def test_only_the_needed_gradients(grads):
    x, weights, biases = _params(torch.float64, grads=grads)
    wanted = [t for t in [x, *weights, *biases] if t.requires_grad]
    got = torch.autograd.grad(_chunked(x, weights, biases, 32).square().sum(), wanted)
    expected = torch.autograd.grad(plain_relu_mlp(x, weights, biases).square().sum(), wanted)
    assert len(got) == len(wanted)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-9)


def test_relu_ties_at_zero_get_no_gradient():
    x = torch.zeros(1, 3000, 2, requires_grad=True)  # every hidden pre-activation is exactly 0
    w1, b1 = torch.ones(8, 2, requires_grad=True), torch.zeros(8, requires_grad=True)
    w2, b2 = torch.ones(2, 8, requires_grad=True), torch.zeros(2, requires_grad=True)
    assert chunking_applies(x, w1)
    chunked_relu_mlp(x, (w1, w2), (b1, b2)).sum().backward()
    assert torch.count_nonzero(x.grad) == 0 and torch.count_nonzero(w1.grad) == 0
    assert torch.equal(b2.grad, torch.full((2,), 3000.0))


def test_where_it_applies():
    w = torch.zeros(8, 4)
    big, small = torch.zeros(2 * chunked_mlp.CHUNK_ROWS + 1, 4), torch.zeros(2 * chunked_mlp.CHUNK_ROWS, 4)
    assert chunking_applies(big, w) and not chunking_applies(small, w)
    assert not chunking_applies(big.double(), w.double())
    with torch.no_grad():
        assert not chunking_applies(big, w)  # inference keeps the packed oneDNN path
    with pytest.raises(ValueError, match="one bias per weight"):
        chunked_relu_mlp(big, [w], [])


def _assert_module_twin(module, chunked_call, plain_call, x):
    assert chunking_applies(x, next(module.parameters()))
    out, expected = chunked_call(x), plain_call(x)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    params = [x, *module.parameters()]
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, params, upstream, allow_unused=True)
    want = torch.autograd.grad(expected, params, upstream, allow_unused=True)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_decoder_layer_ffn_is_the_plain_ffn_in_float32():
    torch.manual_seed(1)
    layer = DecoderLayer(32, 4, 4, 1, 2, 128)
    ffn = torch.nn.ModuleList([layer.linear1, layer.linear2])
    weights, biases = (layer.linear1.weight, layer.linear2.weight), (layer.linear1.bias, layer.linear2.bias)
    _assert_module_twin(ffn, layer.ffn, lambda x: plain_relu_mlp(x, weights, biases), torch.randn(3, 900, 32, requires_grad=True))


def test_mlp_is_the_layer_by_layer_mlp_in_float32():
    torch.manual_seed(2)
    mlp = MLP(32, 32, 4, 3)

    def plain(x):  # F.linear layer by layer
        return plain_relu_mlp(x, [layer.weight for layer in mlp.layers], [layer.bias for layer in mlp.layers])

    _assert_module_twin(mlp, mlp, plain, torch.randn(3, 3, 300, 32, requires_grad=True))


def test_double_backward_is_refused():
    x, weights, biases = _params(torch.float64)
    (grad,) = torch.autograd.grad(_chunked(x, weights, biases, 32).square().sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()
