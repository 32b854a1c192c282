"""The batched torch_linear_assignment solver against SciPy: the same optimum for every (layer,
image, group) problem, the same pairs when costs are distinct; on CPU and, where present, CUDA."""

from dataclasses import replace

import pytest
import torch

pytest.importorskip("torch_linear_assignment")

from detrkit.losses.matcher import SOLVERS, HungarianMatcher, scipy_solver  # noqa: E402
from test_matcher import make_targets, random_layers  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
GROUPS, SIZES = 3, [3, 0, 5, 1]


def solve_both(costs):
    return scipy_solver(costs, SIZES, GROUPS), SOLVERS["torch_linear_assignment"](costs, SIZES, GROUPS)


def problem_totals(matches, cost):
    """{(image, group): total cost}, checking that each group's block matches each target of the
    image once, with distinct queries."""
    queries, block = cost.shape[0], cost.shape[0] // GROUPS
    starts = [sum(SIZES[:i]) for i in range(len(SIZES))]
    pairs = {}
    for q, t in zip(matches.query.tolist(), matches.target.tolist()):
        image, row = divmod(q, queries)
        pairs.setdefault((image, row // block), []).append((row, t))
    for (image, _), found in pairs.items():
        assert sorted(t for _, t in found) == list(range(starts[image], starts[image] + SIZES[image]))
        assert len({row for row, _ in found}) == len(found)
    assert sum(map(len, pairs.values())) == GROUPS * sum(SIZES)
    return {key: sum(cost[row, t].item() for row, t in found) for key, found in pairs.items()}


def layer_costs(generator, device, distinct=True):
    """(Q, T) costs of three layers, two with 6 queries per group and one with 7."""
    total = sum(SIZES)
    costs = [torch.rand(GROUPS * block, total, generator=generator) for block in (6, 6, 7)]
    if not distinct:  # few values, and every second query a copy of the one before
        costs = [torch.randint(0, 3, c.shape, generator=generator).float().repeat_interleave(2, 0)[:len(c)]
                 for c in costs]
    return [c.to(device) for c in costs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(3))
def test_distinct_costs_give_the_same_pairs(device, seed):
    costs = layer_costs(torch.Generator().manual_seed(seed), device)
    for scipy, batched, cost in zip(*solve_both(costs), costs):
        assert batched.query.device.type == device
        assert sorted(zip(scipy.query.tolist(), scipy.target.tolist())) == \
            sorted(zip(batched.query.tolist(), batched.target.tolist()))
        problem_totals(batched, cost.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(3))
def test_ties_give_the_same_total_cost(device, seed):
    costs = layer_costs(torch.Generator().manual_seed(seed), device, distinct=False)
    for scipy, batched, cost in zip(*solve_both(costs), costs):
        assert problem_totals(batched, cost.cpu()) == pytest.approx(problem_totals(scipy, cost.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_matcher_with_either_solver_matches_the_same(device):
    generator = torch.Generator().manual_seed(5)
    layers = [(logits.to(device), boxes.to(device))
              for logits, boxes in random_layers(generator, SIZES, GROUPS, blocks=[6, 7])]
    targets = [replace(t, boxes=t.boxes.to(device), labels=t.labels.to(device))
               for t in make_targets(SIZES, 5, generator)]
    scipy = HungarianMatcher(solver="scipy").match_layers(layers, targets, GROUPS)
    batched = HungarianMatcher(solver="torch_linear_assignment").match_layers(layers, targets, GROUPS)
    for a, b in zip(scipy, batched):
        assert sorted(zip(a.query.tolist(), a.target.tolist())) == sorted(zip(b.query.tolist(), b.target.tolist()))


def test_batched_solver_needs_a_query_per_target_in_each_group():
    costs = [torch.rand(GROUPS * 4, sum(SIZES))]  # 4 queries per group, 5 targets in image 2
    with pytest.raises(ValueError, match="5 targets in one image but only 4 queries per group"):
        SOLVERS["torch_linear_assignment"](costs, SIZES, GROUPS)
