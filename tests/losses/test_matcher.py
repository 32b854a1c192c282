"""Hungarian matcher against brute-force assignment over every permutation, per query group; all
layers matched at once against one layer at a time; the solver registry."""

import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

from detrkit.losses.matcher import SOLVERS, HungarianMatcher, Matches, non_finite_to_worst, replace_non_finite
from detrkit.structures import Target
from twins import brute_force_assign, match_groups, pair_cost


def make_targets(sizes, classes, generator):
    return [Target(torch.rand(n, 4, generator=generator) * 0.5 + 0.2, torch.randint(0, classes, (n,), generator=generator),
                   i, (64, 64), (64, 64)) for i, n in enumerate(sizes)]


def random_outputs(batch, queries, classes, generator):
    logits = torch.randn(batch, queries, classes, generator=generator) * 2
    return logits, torch.rand(batch, queries, 4, generator=generator) * 0.6 + 0.1


def per_image(matches: Matches, queries: int, sizes: list[int]) -> list[dict[int, int]]:
    """Flat matches -> for each image {query within the image: target within the image}."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    found = [{} for _ in sizes]
    for q, t in zip(matches.query.tolist(), matches.target.tolist()):
        found[q // queries][q % queries] = t - starts[q // queries]
    return found


def test_cost_matrix_pairs_each_target_with_the_queries_of_its_image():
    generator = torch.Generator().manual_seed(0)
    logits, boxes = random_outputs(2, 6, 4, generator)
    targets = make_targets([3, 2], 4, generator)
    labels, gt = torch.cat([t.labels for t in targets]), torch.cat([t.boxes for t in targets]).double()
    image = torch.tensor([0, 0, 0, 1, 1])
    cost = HungarianMatcher().cost_matrix(logits.double(), boxes.double(), labels, gt, image)
    assert cost.shape == (6, 5)
    for q in range(6):
        for j in range(5):
            i = image[j].item()
            expected = pair_cost(logits[i, q].tolist(), boxes[i, q].tolist(), labels[j].item(), gt[j].tolist())
            assert abs(cost[q, j].item() - expected) < 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_group_assignment_equals_brute_force(seed):
    generator = torch.Generator().manual_seed(seed)
    groups, block, classes, sizes = 3, 4, 5, [2, 0, 4, 3]
    logits, boxes = random_outputs(len(sizes), groups * block, classes, generator)
    targets = make_targets(sizes, classes, generator)
    matches = HungarianMatcher()(logits, boxes, targets, groups)
    assert matches.query.dtype == matches.target.dtype == torch.int64 and len(matches.query) == groups * sum(sizes)
    for i, found in enumerate(per_image(matches, groups * block, sizes)):
        expected = match_groups(logits[i].tolist(), boxes[i].tolist(), targets[i].labels.tolist(), targets[i].boxes.tolist(), groups)
        assert found == expected
        for g in range(groups):  # every target once per group, within the group's block
            in_block = [j for q, j in found.items() if g * block <= q < (g + 1) * block]
            assert sorted(in_block) == list(range(sizes[i]))


def test_scipy_cost_equals_brute_force_minimum():
    generator = torch.Generator().manual_seed(7)
    logits, boxes = random_outputs(1, 5, 3, generator)
    (target,) = make_targets([3], 3, generator)
    matches = HungarianMatcher()(logits, boxes, [target], groups=1)
    cost = [[pair_cost(logits[0, q].tolist(), boxes[0, q].tolist(), target.labels[j].item(), target.boxes[j].tolist())
             for j in range(3)] for q in range(5)]
    best, _ = brute_force_assign(cost)
    assert abs(sum(cost[q][j] for q, j in zip(matches.query.tolist(), matches.target.tolist())) - best) < 1e-5


def random_layers(generator, sizes, groups, blocks, classes=5):
    """One (logits, boxes) pair per query block size: decoder layers (G*4 queries), encoder (G*5)."""
    return [random_outputs(len(sizes), groups * block, classes, generator) for block in blocks]


class CopyCounter(TorchFunctionMode):
    """Records device -> host (`cpu`) and host -> device (`to` a device) copies."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        to_device = name == "to" and any(isinstance(a, (str, torch.device)) for a in [*args, *(kwargs or {}).values()])
        if name == "cpu" or to_device:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed, sizes", [(0, [2, 0, 4, 3]), (1, [1, 1]), (2, [0, 3, 0]), (3, [4])])
def test_all_layers_at_once_match_one_layer_at_a_time(seed, sizes):
    generator = torch.Generator().manual_seed(seed)
    groups, matcher = 3, HungarianMatcher()
    layers = random_layers(generator, sizes, groups, blocks=[4, 4, 4, 5])
    targets = make_targets(sizes, 5, generator)
    with CopyCounter() as copies:
        together = matcher.match_layers(layers, targets, groups)
    assert copies.calls == ["cpu", "to"]  # one copy each way for the whole step
    for (logits, boxes), matches in zip(layers, together):
        alone = matcher(logits, boxes, targets, groups)
        assert torch.equal(matches.query, alone.query) and torch.equal(matches.target, alone.target)
        for i, found in enumerate(per_image(matches, logits.shape[1], sizes)):
            labels, gt = targets[i].labels.tolist(), targets[i].boxes.tolist()
            assert found == match_groups(logits[i].tolist(), boxes[i].tolist(), labels, gt, groups)


def test_no_targets_match_nothing_without_a_copy():
    generator = torch.Generator().manual_seed(0)
    layers = random_layers(generator, [0, 0], 3, blocks=[4, 5])
    with CopyCounter() as copies:
        matches = HungarianMatcher().match_layers(layers, make_targets([0, 0], 5, generator), 3)
    assert copies.calls == [] and all(len(m.query) == len(m.target) == 0 for m in matches)


def test_non_finite_costs_become_worse_than_every_finite_cost():
    cost = torch.tensor([[1.0, float("inf")], [-3.0, float("nan")]])
    with pytest.warns(UserWarning, match="non-finite"):
        fixed = replace_non_finite(cost)
    torch.testing.assert_close(fixed, torch.tensor([[1.0, 5.0], [-3.0, 5.0]]))  # 1 + |-3| + 1
    torch.testing.assert_close(non_finite_to_worst(torch.full((2, 2), float("nan"))), torch.zeros(2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replace_non_finite(torch.ones(2, 2)).eq(1).all()


def test_nan_prediction_is_left_unmatched_with_one_warning():
    generator = torch.Generator().manual_seed(3)
    logits, boxes = random_outputs(1, 4, 3, generator)
    boxes[0, 1] = float("nan")
    targets = make_targets([3], 3, generator)
    with pytest.warns(UserWarning) as record:
        matches = HungarianMatcher()(logits, boxes, targets, groups=1)
    assert len(record) == 1
    assert sorted(matches.query.tolist()) == [0, 2, 3]


def test_queries_must_split_into_groups():
    generator = torch.Generator().manual_seed(0)
    logits, boxes = random_outputs(1, 7, 3, generator)
    with pytest.raises(ValueError, match="7 queries"):
        HungarianMatcher()(logits, boxes, make_targets([1], 3, generator), groups=3)


def test_unknown_solver_names_the_available_ones():
    assert "scipy" in SOLVERS and HungarianMatcher().solve is SOLVERS["scipy"]
    with pytest.raises(ValueError, match="'scipy'"):
        HungarianMatcher(solver="auction")
