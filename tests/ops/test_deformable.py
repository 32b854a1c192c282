"""deformable_sample, with either sampler, against a per-point bilinear twin written with explicit loops."""

import math

import pytest
import torch
import torch.nn.functional as F

from detrkit.ops.deformable import SAMPLERS, deformable_sample, gather_bilinear


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


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_matches_per_point_twin_on_two_levels(sampler):
    torch.manual_seed(0)
    shapes = [(5, 7), (3, 4)]
    value = torch.randn(2, sum(h * w for h, w in shapes), 3, 4)
    # include points outside the map to exercise zero padding
    locations = torch.rand(2, 6, 3, 2, 2, 2) * 1.4 - 0.2
    weights = torch.rand(2, 6, 3, 2, 2)
    weights = weights / weights.sum((-1, -2), keepdim=True)
    fast = deformable_sample(value, shapes, locations, weights, SAMPLERS[sampler])
    assert fast.shape == (2, 6, 12)
    torch.testing.assert_close(fast.double(), slow_deformable(value, shapes, locations, weights),
                               atol=1e-5, rtol=1e-5)


def test_gather_sampler_equals_grid_sample_inside_on_the_edges_and_outside():
    torch.manual_seed(1)
    image = torch.randn(3, 5, 6, 9)
    grid = torch.rand(3, 7, 11, 2) * 2.6 - 1.3  # a third of the points fall outside [-1, 1]
    grid[0, 0, :4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1 - 1 / 9, 0.0], [1 + 1 / 9, 0.5]])  # borders
    expected = F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    torch.testing.assert_close(gather_bilinear(image, grid), expected, atol=1e-5, rtol=1e-5)  # float rounding
