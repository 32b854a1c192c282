"""Hungarian matcher against brute-force assignment over every permutation, per query group."""

import warnings

import pytest
import torch

from detrkit.losses.matcher import HungarianMatcher, replace_non_finite
from detrkit.structures import Target
from twins import brute_force_assign, match_groups, pair_cost


def make_targets(sizes, classes, generator):
    return [Target(torch.rand(n, 4, generator=generator) * 0.5 + 0.2, torch.randint(0, classes, (n,), generator=generator),
                   i, (64, 64), (64, 64)) for i, n in enumerate(sizes)]


def random_outputs(batch, queries, classes, generator):
    logits = torch.randn(batch, queries, classes, generator=generator) * 2
    return logits, torch.rand(batch, queries, 4, generator=generator) * 0.6 + 0.1


def test_cost_matrix_matches_pairwise_twin():
    generator = torch.Generator().manual_seed(0)
    logits, boxes = random_outputs(1, 6, 4, generator)
    (target,) = make_targets([3], 4, generator)
    cost = HungarianMatcher().cost_matrix(logits[0].double(), boxes[0].double(), target.labels, target.boxes.double())
    for q in range(6):
        for j in range(3):
            expected = pair_cost(logits[0, q].tolist(), boxes[0, q].tolist(), target.labels[j].item(), target.boxes[j].tolist())
            assert abs(cost[q, j].item() - expected) < 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_group_assignment_equals_brute_force(seed):
    generator = torch.Generator().manual_seed(seed)
    groups, block, classes, sizes = 3, 4, 5, [2, 0, 4, 3]
    logits, boxes = random_outputs(len(sizes), groups * block, classes, generator)
    targets = make_targets(sizes, classes, generator)
    matches = HungarianMatcher()(logits, boxes, targets, groups)
    for i, (query, target) in enumerate(matches):
        assert query.dtype == target.dtype == torch.int64 and query.device.type == "cpu"
        assert len(query) == groups * sizes[i]
        found = dict(zip(query.tolist(), target.tolist()))
        expected = match_groups(logits[i].tolist(), boxes[i].tolist(), targets[i].labels.tolist(), targets[i].boxes.tolist(), groups)
        assert found == expected
        for g in range(groups):  # every target once per group, within the group's block
            in_block = [j for q, j in found.items() if g * block <= q < (g + 1) * block]
            assert sorted(in_block) == list(range(sizes[i]))


def test_scipy_cost_equals_brute_force_minimum():
    generator = torch.Generator().manual_seed(7)
    logits, boxes = random_outputs(1, 5, 3, generator)
    (target,) = make_targets([3], 3, generator)
    (query, index), = HungarianMatcher()(logits, boxes, [target], groups=1)
    cost = [[pair_cost(logits[0, q].tolist(), boxes[0, q].tolist(), target.labels[j].item(), target.boxes[j].tolist())
             for j in range(3)] for q in range(5)]
    best, _ = brute_force_assign(cost)
    assert abs(sum(cost[q][j] for q, j in zip(query.tolist(), index.tolist())) - best) < 1e-5


def test_non_finite_costs_become_worse_than_every_finite_cost():
    cost = torch.tensor([[1.0, float("inf")], [-3.0, float("nan")]])
    with pytest.warns(UserWarning, match="non-finite"):
        fixed = replace_non_finite(cost)
    torch.testing.assert_close(fixed, torch.tensor([[1.0, 5.0], [-3.0, 5.0]]))  # 1 + |-3| + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replace_non_finite(torch.ones(2, 2)).eq(1).all()


def test_nan_prediction_is_left_unmatched_with_one_warning():
    generator = torch.Generator().manual_seed(3)
    logits, boxes = random_outputs(1, 4, 3, generator)
    boxes[0, 1] = float("nan")
    targets = make_targets([3], 3, generator)
    with pytest.warns(UserWarning) as record:
        ((query, _),) = HungarianMatcher()(logits, boxes, targets, groups=1)
    assert len(record) == 1
    assert sorted(query.tolist()) == [0, 2, 3]


def test_queries_must_split_into_groups():
    generator = torch.Generator().manual_seed(0)
    logits, boxes = random_outputs(1, 7, 3, generator)
    with pytest.raises(ValueError, match="7 queries"):
        HungarianMatcher()(logits, boxes, make_targets([1], 3, generator), groups=3)
