"""Box-count-normalised manual accumulation (spec 7.7): k micro-batches give the gradient of one
batch holding all of them, for a tiny linear model and for the keypoint criterion."""

import pytest
import torch

from detrkit.losses.accumulation import BoxCountNormaliser, accumulation_scales, rescale_gradients
from detrkit.losses.criterion import SetCriterion, num_boxes_normaliser
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, Target


def test_scales_follow_the_running_count():
    running, first = accumulation_scales(None, torch.tensor(3.0))
    assert running.item() == 3 and first.denominator.item() == 3 and first.gradients is None
    running, second = accumulation_scales(running, torch.tensor(2.0))
    assert running.item() == 5 and second.denominator.item() == 5 and second.gradients.item() == pytest.approx(0.6)
    normaliser = BoxCountNormaliser()
    normaliser.scales(torch.tensor(4.0))
    normaliser.reset()
    assert normaliser.scales(torch.tensor(1.0)).gradients is None


def test_rescaling_skips_parameters_without_gradients():
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    used.grad = torch.full((2,), 3.0)
    rescale_gradients([used, unused], torch.tensor(0.5, dtype=torch.float64))
    assert used.grad.tolist() == [1.5, 1.5] and used.grad.dtype == torch.float32 and unused.grad is None
    rescale_gradients([used], None)
    assert used.grad.tolist() == [1.5, 1.5]


def box_numerator(model, inputs, targets):
    """Σ over boxes of a per-box loss: what the criterion returns with num_boxes = 1."""
    return ((model(inputs) - targets) ** 2).sum()


def accumulate(model, micro_batches, normaliser):
    """Manual accumulation: rescale earlier gradients, then backward numerator / running count."""
    for inputs, targets in micro_batches:
        scales = normaliser.scales(torch.tensor(float(len(inputs))))
        rescale_gradients(model.parameters(), scales.gradients)
        (box_numerator(model, inputs, targets) / scales.denominator).backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


@pytest.mark.parametrize("counts", [[4, 4, 4, 4], [1, 5, 2, 7], [3, 1]])
def test_k_micro_batches_equal_one_batch_of_all_boxes(counts):
    generator = torch.Generator().manual_seed(sum(counts))
    model = torch.nn.Linear(3, 2)
    inputs = torch.randn(sum(counts), 3, generator=generator)
    targets = torch.randn(sum(counts), 2, generator=generator)
    micro = list(zip(inputs.split(counts), targets.split(counts)))
    normaliser = BoxCountNormaliser()
    accumulated = accumulate(model, micro, normaliser)
    model.zero_grad()
    (box_numerator(model, inputs, targets) / sum(counts)).backward()
    for mine, batch in zip(accumulated, model.parameters()):
        torch.testing.assert_close(mine, batch.grad, rtol=0, atol=1e-6)
    # the next window starts afresh after reset
    normaliser.reset()
    model.zero_grad()
    again = accumulate(model, micro, normaliser)
    assert all(torch.equal(a, b) for a, b in zip(again, accumulated))


def test_keypoint_criterion_numerators_accumulate_to_the_batch_loss():
    """Images split into micro-batches: criterion numerators (num_boxes = 1) over each, scaled by
    the running normaliser, give the gradient of the criterion on all images at once."""
    generator = torch.Generator().manual_seed(0)
    batch, groups, queries, schema = 4, 2, 6, [3]
    leaves = {"logits": torch.randn(batch, queries, 2, generator=generator, dtype=torch.float64),
              "boxes": torch.rand(batch, queries, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2,
              "keypoints": torch.rand(batch, queries, 3, 8, generator=generator, dtype=torch.float64)}
    leaves = {name: tensor.requires_grad_(True) for name, tensor in leaves.items()}
    targets = []
    for i, n in enumerate([2, 0, 3, 1]):
        keypoints = torch.rand(n, 3, 3, generator=generator, dtype=torch.float64)
        keypoints[..., 2] = torch.randint(0, 3, (n, 3), generator=generator).double()
        targets.append(Target(torch.rand(n, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2,
                              torch.zeros(n, dtype=torch.int64), i, (64, 64), (64, 64), keypoints=keypoints))
    criterion = SetCriterion(HungarianMatcher(num_keypoints_per_class=schema), num_keypoints_per_class=schema)

    def outputs(images):
        return DetectorOutput(leaves["logits"][images], leaves["boxes"][images],
                              pred_keypoints=leaves["keypoints"][images])

    normaliser = BoxCountNormaliser()
    for images in (slice(0, 2), slice(2, 4)):
        count = num_boxes_normaliser(targets[images], groups, torch.device("cpu")).double()  # fp64 scales
        numerator = criterion(outputs(images), targets[images], groups, num_boxes=torch.ones_like(count)).total
        scales = normaliser.scales(count)
        rescale_gradients(leaves.values(), scales.gradients)
        (numerator / scales.denominator).backward()
    accumulated = {name: tensor.grad.clone() for name, tensor in leaves.items()}
    for tensor in leaves.values():
        tensor.grad = None
    criterion(outputs(slice(0, 4)), targets, groups).total.backward()
    for name, tensor in leaves.items():
        torch.testing.assert_close(accumulated[name], tensor.grad, rtol=0, atol=1e-12,
                                   msg=lambda text, name=name: f"{name}: {text}")
