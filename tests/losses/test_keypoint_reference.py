"""Keypoint criterion and costs against values the reference rfdetr 1.11.2 computed on the same
inputs (tests/data/keypoint_loss_reference.pt).

The file was written by a side script run in the reference's own environment (never part of
detrkit), on float32 CPU inputs: per case, its HungarianMatcher (costs 2/5/2, the case's keypoint
coefficients and schema) and SetCriterion (IA-BCE; labels, boxes, cardinality, keypoints; cls
weight 2) in training mode, total = Σ weight·term backpropagated, once with the default
normaliser and once with num_boxes = 1; its matcher per layer; its keypoint matching costs of the
final layer; and its per-pair keypoint loss on matched pairs, one case with NaN, inf, overflowing
log-precisions, a zero and a NaN area and an unlabeled target.
Identical: the matches. Within 4 float32 ulps of each tensor's largest entry (see ulps.py: the
last bits differ by CPU; on the CPU that wrote the file all but the findable and visible costs
and the box gradients were bit-identical): every term, the totals, the per-pair losses and their
gradients, the costs and the keypoint, logit and box gradients.
"""

from pathlib import Path

import pytest
import torch

from detrkit.losses.criterion import SetCriterion
from detrkit.losses.keypoints import keypoint_costs, keypoint_losses, select_keypoints
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, Target
from ulps import assert_within_ulps

DATA = torch.load(Path(__file__).parents[1] / "data" / "keypoint_loss_reference.pt", weights_only=True)
CASES = ["person", "classes", "one_image"]


def criterion_for(case):
    l1, findable, visible, nll = case["coefs"]
    matcher = HungarianMatcher(num_keypoints_per_class=case["schema"], cost_keypoint_l1=l1,
                               cost_keypoint_findable=findable, cost_keypoint_visible=visible, cost_keypoint_nll=nll)
    return SetCriterion(matcher, cls_loss_coef=2.0, num_keypoints_per_class=case["schema"], keypoint_l1_loss_coef=l1,
                        keypoint_findable_loss_coef=findable, keypoint_visible_loss_coef=visible,
                        keypoint_nll_loss_coef=nll)


def outputs_and_targets(case):
    """Fresh leaves (requiring grad), the final DetectorOutput holding every layer, the targets."""
    leaves = [{name: value.clone().requires_grad_(True) for name, value in layer.items()} for layer in case["layers"]]
    layers = []
    for leaf in leaves:
        layers.append(DetectorOutput(leaf["pred_logits"], leaf["pred_boxes"], pred_keypoints=leaf["pred_keypoints"]))
    outputs = layers[0]
    outputs.aux_outputs, outputs.enc_outputs = layers[1:-1], layers[-1]
    targets = [Target(t["boxes"], t["labels"], i, (64, 64), (64, 64), keypoints=t["keypoints"])
               for i, t in enumerate(case["targets"])]
    return leaves, outputs, targets


@pytest.mark.parametrize("name", CASES)
def test_terms_total_and_gradients_are_the_reference(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]["normalised"]
    leaves, outputs, targets = outputs_and_targets(case)
    result = criterion_for(case)(outputs, targets, case["groups"])
    result.total.backward()
    assert set(result.terms) == set(reference["losses"])
    for key, value in reference["losses"].items():
        assert_within_ulps(result.terms[key], value, label=key)
    assert_within_ulps(result.total, reference["total"])
    for layer, (leaf, grads) in enumerate(zip(leaves, reference["grads"])):
        for key in ("pred_keypoints", "pred_logits", "pred_boxes"):
            assert_within_ulps(leaf[key].grad, grads[key], label=(layer, key))


@pytest.mark.parametrize("name", CASES)
def test_numerators_with_unit_normaliser_are_the_reference(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]["numerators"]
    _, outputs, targets = outputs_and_targets(case)
    result = criterion_for(case)(outputs, targets, case["groups"], num_boxes=torch.ones(()))
    for key, value in reference["losses"].items():
        assert_within_ulps(result.terms[key], value, label=key)
    assert_within_ulps(result.total, reference["total"])


@pytest.mark.parametrize("name", CASES)
def test_every_layer_matches_the_same_pairs(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]
    _, outputs, targets = outputs_and_targets(case)
    layers = [outputs, *outputs.aux_outputs, outputs.enc_outputs]
    matches = criterion_for(case).matcher.match_layers(
        [(o.pred_logits, o.pred_boxes) for o in layers], targets, case["groups"],
        keypoints=[o.pred_keypoints for o in layers], target_keypoints=torch.cat([t.keypoints for t in targets]))
    starts = torch.tensor([0, *[len(t.labels) for t in targets]]).cumsum(0)
    for layer_matches, layer_indices, output in zip(matches, reference["indices"], layers):
        queries = output.pred_logits.shape[1]
        image = layer_matches.query // queries
        assert layer_matches.counts == [len(rows) for rows, _ in layer_indices]
        assert torch.equal(layer_matches.query % queries, torch.cat([rows for rows, _ in layer_indices]))
        assert torch.equal(layer_matches.target - starts[image], torch.cat([cols for _, cols in layer_indices]))


@pytest.mark.parametrize("name", CASES)
def test_matching_costs_are_the_reference(name):
    """The reference costs every query against every target, (B, Q, T); detrkit keeps, for each
    target, the queries of its own image."""
    case, reference = DATA[name]["case"], DATA[name]["reference"]["costs"]
    targets = case["targets"]
    boxes = torch.cat([t["boxes"] for t in targets])
    image = torch.cat([torch.full((len(t["labels"]),), i) for i, t in enumerate(targets)])
    ours = keypoint_costs(case["layers"][0]["pred_keypoints"], image, torch.cat([t["labels"] for t in targets]),
                          torch.cat([t["keypoints"] for t in targets]), boxes[:, 2] * boxes[:, 3], case["schema"])
    own_image = [full[image, :, torch.arange(len(image))].T for full in reference]
    for name, mine, theirs in zip(("l1", "findable", "visible", "nll"), ours, own_image):
        assert_within_ulps(mine, theirs, label=name)


@pytest.mark.parametrize("name", ["loss_finite", "loss_non_finite"])
def test_per_pair_losses_and_gradients_are_the_reference(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]
    leaf = case["pred"].clone().requires_grad_(True)
    pred, active = select_keypoints(leaf, case["labels"], case["schema"])
    losses = keypoint_losses(pred, case["target"], active, case["area"])
    sum(loss.sum() for loss in losses).backward()
    assert_within_ulps(torch.stack(losses), reference["parts"])
    assert_within_ulps(leaf.grad, reference["grad"])
