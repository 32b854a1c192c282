"""ReLU MLPs (`linear -> relu -> ... -> linear`) with a row-chunked CPU training path.

In training the decoder runs every query group at once (13 x 300 queries per image), so for a
batch of 4 the decoder FFN's hidden activation is a (15600, 2048) tensor of about 128 MB, and the
box head's are (31200, 256). On CPU each such tensor is a fresh mmap'd allocation (glibc maps
anything over 32 MB), so the ReLU, its mask in backward and the GEMMs that write them run at
page-fault and memory-bandwidth speed instead of GEMM speed. The chunked path computes the same
products a few hundred rows at a time, so the ReLU and its backward mask touch cache-sized
blocks right after the GEMM that wrote them, and the hidden gradients live in small reused
buffers. It saves the input and the hidden activations (ReLU outputs, written once in forward)
and recomputes nothing. The products are the plain path's; only the order of the additions in
the weight and bias gradients differs (float rounding). Measured on 2 cores, Nano at 320 px,
batch 4: page faults per training step fall from about 404k to 276k, and the ReLU and its
backward (threshold_backward + clamp_min) from about 0.9 s to 0.2 s of the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

CHUNK_ROWS = 256


def chunking_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True for fp32 CPU training outside tracing and compilation, on inputs big enough to matter."""
    return (
        torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() // x.shape[-1] > 2 * CHUNK_ROWS
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def relu_mlp(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor],
             chunk_rows: int | None = None) -> torch.Tensor:
    """`linear(relu(... relu(linear(x, w0, b0)) ...), wn, bn)`, chunked over rows where that applies."""
    if len(weights) != len(biases) or not weights:
        raise ValueError(f"relu_mlp needs one bias per weight, got {len(weights)} weights and {len(biases)} biases")
    if chunking_applies(x, weights[0]):
        return _ChunkedReluMLP.apply(x, chunk_rows or CHUNK_ROWS, len(weights), *weights, *biases)
    return plain_relu_mlp(x, weights, biases)


def plain_relu_mlp(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]) -> torch.Tensor:
    """The unchunked twin."""
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = F.linear(x, w, b)
        if i < len(weights) - 1:
            x = F.relu(x)
    return x


def _relu_mask_(grad: torch.Tensor, relu_out: torch.Tensor) -> None:
    """grad *= (relu_out > 0) in place: ReLU's gradient from its own output. The fused kernel is
    about 30x faster on CPU than `masked_fill_` with a boolean mask."""
    torch.ops.aten.threshold_backward.grad_input(grad, relu_out, 0, grad_input=grad)


def _chunks(rows: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]


class _ChunkedReluMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, chunk_rows, layers, *params):  # noqa: ANN001, ANN205 (autograd signature)
        weights, biases = params[:layers], params[layers:]
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        rows = flat.shape[0]
        outputs = [flat.new_empty(rows, w.shape[0]) for w in weights]  # hidden activations, then the result
        for part in _chunks(rows, chunk_rows):
            source = flat[part]
            for i, (w, b) in enumerate(zip(weights, biases)):
                target = outputs[i][part]
                torch.addmm(b, source, w.t(), out=target)
                if i < layers - 1:
                    target.relu_()
                source = target
        ctx.save_for_backward(flat, *outputs[:-1], *weights)
        ctx.chunk_rows, ctx.layers = chunk_rows, layers
        return outputs[-1].view(*x.shape[:-1], weights[-1].shape[0])

    @staticmethod
    @once_differentiable  # no double backward: a clear error instead of wrong second derivatives
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        layers = ctx.layers
        saved = ctx.saved_tensors
        flat, hidden, weights = saved[0], saved[1:layers], saved[layers:]
        need = ctx.needs_input_grad
        need_x, need_w, need_b = need[0], need[3:3 + layers], need[3 + layers:]
        grad = grad_out.reshape(-1, grad_out.shape[-1]).contiguous()
        rows = flat.shape[0]
        inputs = (flat, *hidden)  # the input of layer i
        grad_w = [torch.zeros_like(w) if n else None for w, n in zip(weights, need_w)]
        grad_b = [w.new_zeros(w.shape[0]) if n else None for w, n in zip(weights, need_b)]
        grad_x = torch.empty_like(flat) if need_x else None
        # The lowest layer whose input gradient is needed: below it nothing needs computing.
        lowest = 0 if need_x else next((i for i in range(layers) if need_w[i] or need_b[i]), layers)
        scratch = [flat.new_empty(min(ctx.chunk_rows, rows), h.shape[1]) for h in hidden]
        for part in _chunks(rows, ctx.chunk_rows):
            g = grad[part]
            for i in range(layers - 1, lowest - 1, -1):
                source = inputs[i][part]
                if grad_w[i] is not None:
                    grad_w[i].addmm_(g.t(), source)
                if grad_b[i] is not None:
                    grad_b[i] += g.sum(0)
                if i == 0:
                    if grad_x is not None:
                        torch.mm(g, weights[0], out=grad_x[part])
                elif i > lowest:
                    below = scratch[i - 1][: part.stop - part.start]
                    torch.mm(g, weights[i], out=below)
                    _relu_mask_(below, source)
                    g = below
        if grad_x is not None:
            grad_x = grad_x.view(grad_out.shape[:-1] + (flat.shape[1],))
        return (grad_x, None, None, *grad_w, *grad_b)
