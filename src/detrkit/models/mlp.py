"""Plain multi-layer perceptron with ReLU between layers (box heads, query-position head)."""

from __future__ import annotations

import torch
from torch import nn

from detrkit.ops.chunked_mlp import chunked_relu_mlp, chunking_applies
from detrkit.ops.linear import Linear


class MLP(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        activations = ["relu"] * (num_layers - 1) + ["none"]
        self.layers = nn.ModuleList(
            Linear(a, b, activation=act) for a, b, act in zip(dims[:-1], dims[1:], activations))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if chunking_applies(x, self.layers[0].weight):  # CPU training: cache-sized row chunks
            return chunked_relu_mlp(x, [layer.weight for layer in self.layers], [layer.bias for layer in self.layers])
        for layer in self.layers:
            x = layer(x)
        return x
