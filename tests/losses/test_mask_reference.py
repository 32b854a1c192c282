"""Segmentation criterion against values the reference rfdetr 1.11.2 computed on the same inputs
and seed (tests/data/mask_loss_reference.pt): the matches and the random stream after the call are
identical; every term, the total and the gradients agree within 4 float32 ulps of their largest
entry (the bits differ by CPU, see ulps.py; on the CPU that wrote the file they were identical).

The file was written by a side script run in the reference's own environment (never part of
detrkit): per case, its HungarianMatcher (costs 2/5/2, mask costs 5/5, ratio 16) and SetCriterion
(IA-BCE; labels, boxes, cardinality, masks) were called after torch.manual_seed(seed) on float32
CPU inputs, target masks padded to the input size by hand, and total = Σ weight·term backpropagated.
Its shipped mask losses are TorchScript functions whose autodiff rounds differently from eager
autograd: `grads` come from the same call with the reference's eager versions of those functions;
`grads_scripted` (case "factors") from the shipped ones, within one float32 ulp of ours.
"""

from pathlib import Path

import pytest
import torch

from detrkit.losses.criterion import SetCriterion
from detrkit.losses.masks import pad_target_masks
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, MaskFactors, Target
from ulps import assert_within_ulps

DATA = torch.load(Path(__file__).parents[1] / "data" / "mask_loss_reference.pt", weights_only=True)
CASES = ["factors", "factors_big", "dense", "padded", "padded_dense", "empty"]
LEAVES = ("spatial", "queries", "bias")


def outputs_and_targets(case):
    """Fresh leaves (requiring grad), the DetectorOutput built from them and the unpadded targets."""
    leaves = [{name: value.clone().requires_grad_(True) for name, value in layer.items()} for layer in case["layers"]]
    layers = []
    for leaf in leaves:
        factors = MaskFactors(leaf["spatial"], leaf["queries"], leaf["bias"])
        layers.append(DetectorOutput(leaf["pred_logits"], leaf["pred_boxes"],
                                     pred_masks=factors.dense() if case["dense"] else factors))
    outputs = layers[-2]
    outputs.aux_outputs, outputs.enc_outputs = layers[:-2], layers[-1]
    targets = [Target(t["boxes"], t["labels"], i, tuple(t["masks"].shape[-2:]), tuple(t["masks"].shape[-2:]),
                      masks=t["masks"]) for i, t in enumerate(case["targets"])]
    return leaves, outputs, targets


def run(case):
    leaves, outputs, targets = outputs_and_targets(case)
    torch.manual_seed(case["seed"])
    result = SetCriterion(HungarianMatcher())(outputs, targets, case["groups"], image_size=tuple(case["image"]))
    next_draw = torch.rand(3)
    result.total.backward()
    return leaves, result, next_draw


@pytest.mark.parametrize("name", CASES)
def test_terms_total_gradients_and_random_stream_are_the_reference(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]
    leaves, result, next_draw = run(case)
    expected = {key: value for key, value in reference["losses"].items() if key.startswith("loss_")}
    assert set(result.terms) == set(expected)
    for key, value in expected.items():
        assert_within_ulps(result.terms[key], value, label=key)
    assert_within_ulps(result.total, reference["total"])
    assert torch.equal(next_draw, reference["next_draw"])  # the same number of random draws, in order
    for layer, (leaf, grads) in enumerate(zip(leaves, reference["grads"])):
        for key in LEAVES:
            assert_within_ulps(leaf[key].grad, grads[key], label=(layer, key))


@pytest.mark.parametrize("name", CASES)
def test_every_layer_matches_the_same_pairs(name):
    case, reference = DATA[name]["case"], DATA[name]["reference"]
    _, outputs, targets = outputs_and_targets(case)
    layers = [outputs, *outputs.aux_outputs, outputs.enc_outputs]
    target_masks = pad_target_masks([t.masks for t in targets], tuple(case["image"]))
    torch.manual_seed(case["seed"])
    matches = HungarianMatcher().match_layers([(o.pred_logits, o.pred_boxes) for o in layers], targets, case["groups"],
                                              [o.pred_masks for o in layers], target_masks)
    starts = torch.tensor([0, *[len(t.labels) for t in targets]]).cumsum(0)
    for layer_matches, layer_indices, output in zip(matches, reference["indices"], layers):
        queries = output.pred_logits.shape[1]
        image = layer_matches.query // queries
        assert layer_matches.counts == [len(rows) for rows, _ in layer_indices]
        rows = torch.cat([rows for rows, _ in layer_indices])
        columns = torch.cat([columns for _, columns in layer_indices])
        assert torch.equal(layer_matches.query % queries, rows)
        assert torch.equal(layer_matches.target - starts[image], columns)


def test_shipped_torchscript_gradients_are_within_a_few_ulps():
    leaves, _, _ = run(DATA["factors"]["case"])
    for leaf, grads in zip(leaves, DATA["factors"]["reference"]["grads_scripted"]):
        for key in LEAVES:
            assert_within_ulps(leaf[key].grad, grads[key], label=key)


@pytest.mark.parametrize("form", ["factors", "dense"])
def test_matcher_mask_costs_are_the_reference_costs(form):
    """The reference costs every query against every target, (B·Q, T); the matcher keeps, for each
    target, the queries of its own image."""
    data = DATA["mask_costs"]
    case, (ce, dice) = data["case"], data[form]
    layer = case["layers"][0]
    factors = MaskFactors(layer["spatial"], layer["queries"], layer["bias"])
    targets = case["targets"]
    masks = torch.cat([t["masks"] for t in targets])
    image = torch.cat([torch.full((len(t["labels"]),), i) for i, t in enumerate(targets)])
    torch.manual_seed(case["seed"])
    ours = HungarianMatcher().mask_costs(factors if form == "factors" else factors.dense(), masks, image)
    batch, queries = layer["queries"].shape[:2]
    for mine, full in zip(ours, (ce, dice)):
        own_image = full.view(batch, queries, -1)[image, :, torch.arange(len(image))].T
        assert torch.equal(mine, 5 * own_image)
