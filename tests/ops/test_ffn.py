"""The row-chunked ReLU FFN against the plain two-layer path: values and every gradient."""

import pytest
import torch
import torch.nn.functional as F

from detrkit.models.decoder import DecoderLayer
from detrkit.ops import ffn
from detrkit.ops.ffn import _ChunkedReluFFN, chunking_applies, relu_ffn


def _params(dtype, d=16, hidden=64, grads=(True, True, True, True, True)):
    torch.manual_seed(0)
    shapes = [(3, 70, d), (hidden, d), (hidden,), (d, hidden), (d,)]
    return [torch.randn(s, dtype=dtype, requires_grad=g) for s, g in zip(shapes, grads)]


def _plain(x, w1, b1, w2, b2):
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


@pytest.mark.parametrize("chunk", [1, 16, 64, 209, 1000])
def test_chunked_matches_plain_in_float64(chunk):
    inputs = _params(torch.float64)
    out = _ChunkedReluFFN.apply(*inputs, chunk)
    expected = _plain(*inputs)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    upstream = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, upstream), torch.autograd.grad(expected, inputs, upstream)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_gradcheck():
    inputs = _params(torch.float64, d=4, hidden=6)
    inputs[0] = inputs[0][:, :9].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: _ChunkedReluFFN.apply(*a, 5), inputs)


@pytest.mark.parametrize("grads", [(True, False, False, False, False), (False, True, True, True, True),
                                   (False, False, False, True, False), (True, True, False, True, False)])
def test_only_the_needed_gradients(grads):
    inputs = _params(torch.float64, grads=grads)
    wanted = [t for t in inputs if t.requires_grad]
    got = torch.autograd.grad(_ChunkedReluFFN.apply(*inputs, 32).square().sum(), wanted)
    expected = torch.autograd.grad(_plain(*inputs).square().sum(), wanted)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-9)


def test_relu_ties_at_zero_get_no_gradient():
    x = torch.zeros(1, 2000, 2, requires_grad=True)  # every hidden pre-activation is exactly 0
    w1, b1 = torch.ones(8, 2, requires_grad=True), torch.zeros(8, requires_grad=True)
    w2, b2 = torch.ones(2, 8, requires_grad=True), torch.zeros(2, requires_grad=True)
    assert chunking_applies(x, w1)
    relu_ffn(x, w1, b1, w2, b2).sum().backward()
    assert torch.count_nonzero(x.grad) == 0 and torch.count_nonzero(w1.grad) == 0
    assert torch.equal(b2.grad, torch.full((2,), 2000.0))


def test_where_it_applies():
    w = torch.zeros(8, 4)
    big, small = torch.zeros(2 * ffn.CHUNK_ROWS + 1, 4), torch.zeros(2 * ffn.CHUNK_ROWS, 4)
    assert chunking_applies(big, w) and not chunking_applies(small, w)
    assert not chunking_applies(big.double(), w.double())
    with torch.no_grad():
        assert not chunking_applies(big, w)  # inference keeps the packed oneDNN path


def test_decoder_layer_ffn_is_the_plain_ffn_in_float32():
    torch.manual_seed(1)
    layer = DecoderLayer(32, 4, 4, 1, 2, 128)
    x = torch.randn(2, 900, 32, requires_grad=True)
    assert chunking_applies(x, layer.linear1.weight)
    out = layer.ffn(x)
    expected = layer.linear2(layer.linear1(x))
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    params = [x, layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias]
    upstream = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, params, upstream), torch.autograd.grad(expected, params, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
