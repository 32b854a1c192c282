"""deformable_sample against a per-point bilinear twin written with explicit loops."""

import math

import torch

from detrkit.ops.deformable import deformable_sample


def bilinear_zero_padded(image: torch.Tensor, x: float, y: float) -> torch.Tensor:
    """image (C, H, W); (x, y) in [0, 1] image-relative, pixel centres at (i + 0.5) / size."""
    channels, height, width = image.shape
    px, py = x * width - 0.5, y * height - 0.5
    x0, y0 = math.floor(px), math.floor(py)
    total = torch.zeros(channels, dtype=torch.float64)
    for dy in (0, 1):
        for dx in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1 - abs(px - xi)) * (1 - abs(py - yi))
            if 0 <= xi < width and 0 <= yi < height:
                total += weight * image[:, yi, xi].double()
    return total


def slow_deformable(value, shapes, locations, weights):
    batch, _, heads, head_dim = value.shape
    _, queries, _, levels, points, _ = locations.shape
    out = torch.zeros(batch, queries, heads, head_dim, dtype=torch.float64)
    starts = [0]
    for h, w in shapes:
        starts.append(starts[-1] + h * w)
    for b in range(batch):
        for q in range(queries):
            for m in range(heads):
                for lvl, (h, w) in enumerate(shapes):
                    image = value[b, starts[lvl]:starts[lvl + 1], m].T.reshape(head_dim, h, w)
                    for p in range(points):
                        x, y = locations[b, q, m, lvl, p].tolist()
                        out[b, q, m] += weights[b, q, m, lvl, p].double() * bilinear_zero_padded(image, x, y)
    return out.reshape(batch, queries, heads * head_dim)


def test_matches_per_point_twin_on_two_levels():
    torch.manual_seed(0)
    shapes = [(5, 7), (3, 4)]
    value = torch.randn(2, sum(h * w for h, w in shapes), 3, 4)
    # include points outside the map to exercise zero padding
    locations = torch.rand(2, 6, 3, 2, 2, 2) * 1.4 - 0.2
    weights = torch.rand(2, 6, 3, 2, 2)
    weights = weights / weights.sum((-1, -2), keepdim=True)
    fast = deformable_sample(value, shapes, locations, weights)
    assert fast.shape == (2, 6, 12)
    torch.testing.assert_close(fast.double(), slow_deformable(value, shapes, locations, weights),
                               atol=1e-5, rtol=1e-5)
