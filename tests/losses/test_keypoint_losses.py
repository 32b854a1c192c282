"""Keypoint losses and matching costs against loop twins of spec 9's formulas, in the criterion
over every output layer, and their edges: non-finite entries, labels beyond the schema, absent
keypoints, empty batches, bf16 outputs, the builder."""

import math

import pytest
import torch

from detrkit.config import KeypointTrainConfig, ModelConfig, TrainConfig
from detrkit.losses.criterion import SetCriterion, build_criterion
from detrkit.losses.keypoints import keypoint_costs, keypoint_losses, select_keypoints
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, Target
from twins import box_losses, class_block, ia_bce, iou_giou, keypoint_pair_terms, match_groups_by, pair_cost, xyxy

SCHEMA = [3, 4, 0]  # keypoint classes 0-2, K = 4 slots; labels 3 and 4 have no keypoints
SLOTS, CLASSES, GROUPS, BLOCK = 4, 5, 2, 3
COEFS = (0.5, 2.0, 1.5, 0.25)  # l1, findable, visible, nll
SUFFIXES = ["", "_0", "_enc"]
NAMES = ["loss_keypoints_l1", "loss_keypoints_findable", "loss_keypoints_visible", "loss_keypoints_nll"]


def random_keypoints(generator, *prefix):
    """(*prefix, 3·K, 8) predictions: x, y in [0, 1], logits, Cholesky terms, class contributions."""
    kp = torch.randn(*prefix, len(SCHEMA) * SLOTS, 8, generator=generator, dtype=torch.float64)
    kp[..., :2] = torch.rand(*prefix, len(SCHEMA) * SLOTS, 2, generator=generator, dtype=torch.float64)
    kp[..., 4:7] *= 0.5
    return kp


def random_targets(generator, sizes):
    targets = []
    for i, n in enumerate(sizes):
        keypoints = torch.rand(n, SLOTS, 3, generator=generator, dtype=torch.float64)
        keypoints[..., 2] = torch.randint(0, 3, (n, SLOTS), generator=generator).double()
        targets.append(Target(torch.rand(n, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2,
                              torch.randint(0, CLASSES, (n,), generator=generator), i, (64, 64), (64, 64),
                              keypoints=keypoints))
    return targets


def make_layer(generator, batch):
    queries = GROUPS * BLOCK
    output = DetectorOutput(torch.randn(batch, queries, CLASSES, generator=generator, dtype=torch.float64) * 2,
                            torch.rand(batch, queries, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2)
    output.pred_keypoints = random_keypoints(generator, batch, queries)
    for tensor in (output.pred_logits, output.pred_boxes, output.pred_keypoints):
        tensor.requires_grad_(True)
    return output


def make_case(seed, sizes=(2, 0, 3)):
    generator = torch.Generator().manual_seed(seed)
    outputs = make_layer(generator, len(sizes))
    outputs.aux_outputs, outputs.enc_outputs = [make_layer(generator, len(sizes))], make_layer(generator, len(sizes))
    return outputs, random_targets(generator, sizes)


def make_criterion(coefs=COEFS):
    costs = dict(zip(["cost_keypoint_l1", "cost_keypoint_findable", "cost_keypoint_visible", "cost_keypoint_nll"],
                     coefs))
    weights = dict(zip(["keypoint_l1_loss_coef", "keypoint_findable_loss_coef", "keypoint_visible_loss_coef",
                        "keypoint_nll_loss_coef"], coefs))
    return SetCriterion(HungarianMatcher(num_keypoints_per_class=SCHEMA, **costs), cls_loss_coef=2.0,
                        num_keypoints_per_class=SCHEMA, **weights)


def twin_pair(pred_rows, label, target_rows, box):
    rows, active = class_block(pred_rows, label, SCHEMA)
    return keypoint_pair_terms(rows, target_rows, active, box[2] * box[3])


def twin_layer(output, targets, num_boxes):
    """Every term of one layer: brute-force matching on the box + weighted keypoint cost, then
    the losses, image by image and pair by pair."""
    totals = dict.fromkeys(["loss_ce", "loss_bbox", "loss_giou", *NAMES], 0.0)
    for i, target in enumerate(targets):
        logits, boxes = output.pred_logits[i].tolist(), output.pred_boxes[i].tolist()
        keypoints = output.pred_keypoints[i].tolist()
        labels, gt, gt_keypoints = target.labels.tolist(), target.boxes.tolist(), target.keypoints.tolist()

        def cost(q, j, logits=logits, boxes=boxes, keypoints=keypoints, labels=labels, gt=gt, gt_kps=gt_keypoints):
            terms = twin_pair(keypoints[q], labels[j], gt_kps[j], gt[j])
            return pair_cost(logits[q], boxes[q], labels[j], gt[j]) + sum(c * t for c, t in zip(COEFS, terms))

        matched = match_groups_by(cost, len(boxes), len(labels), GROUPS)
        totals["loss_ce"] += ia_bce(logits, {q: (labels[j], iou_giou(xyxy(boxes[q]), xyxy(gt[j]))[0])
                                             for q, j in matched.items()})
        l1, giou = box_losses([(boxes[q], gt[j]) for q, j in matched.items()])
        totals["loss_bbox"] += l1
        totals["loss_giou"] += giou
        for q, j in matched.items():
            for name, term in zip(NAMES, twin_pair(keypoints[q], labels[j], gt_keypoints[j], gt[j])):
                totals[name] += term
    return {name: value / num_boxes for name, value in totals.items()}


@pytest.mark.parametrize("seed", range(3))
def test_every_layer_matches_the_loop_twin(seed):
    outputs, targets = make_case(seed)
    result = make_criterion()(outputs, targets, GROUPS)
    layers = dict(zip(SUFFIXES, [outputs, *outputs.aux_outputs, outputs.enc_outputs]))
    expected_total = 0.0
    weights = dict(zip(["loss_ce", "loss_bbox", "loss_giou", *NAMES], [2.0, 5.0, 2.0, *COEFS]))
    for suffix, output in layers.items():
        for name, value in twin_layer(output, targets, num_boxes=5 * GROUPS).items():
            assert abs(result.terms[name + suffix].item() - value) < 1e-9, name + suffix
            expected_total += weights[name] * value
    assert abs(result.total.item() - expected_total) < 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_pair_losses_match_the_twin(seed):
    generator = torch.Generator().manual_seed(seed)
    target = random_targets(generator, [7])[0]
    pred = random_keypoints(generator, 7)
    pred, active = select_keypoints(pred, target.labels, SCHEMA)
    area = target.boxes[:, 2] * target.boxes[:, 3]
    losses = torch.stack(keypoint_losses(pred, target.keypoints, active, area), 1)  # (M, 4)
    for m in range(7):
        expected = keypoint_pair_terms(pred[m].tolist(), target.keypoints[m].tolist(), active[m].sum().item(),
                                       area[m].item())
        assert losses[m].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12), m


@pytest.mark.parametrize("seed", range(4))
def test_matching_costs_match_the_twin(seed):
    generator = torch.Generator().manual_seed(seed)
    targets = random_targets(generator, [3, 2])
    pred = random_keypoints(generator, 2, 5)
    image = torch.tensor([0, 0, 0, 1, 1])
    labels, boxes = torch.cat([t.labels for t in targets]), torch.cat([t.boxes for t in targets])
    gt = torch.cat([t.keypoints for t in targets])
    costs = torch.stack(keypoint_costs(pred, image, labels, gt, boxes[:, 2] * boxes[:, 3], SCHEMA), -1)  # (Q, T, 4)
    for q in range(5):
        for j in range(5):
            expected = twin_pair(pred[image[j], q].tolist(), labels[j].item(), gt[j].tolist(), boxes[j].tolist())
            assert costs[q, j].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12), (q, j)


def test_the_matcher_weighs_each_keypoint_cost_by_its_coefficient():
    generator = torch.Generator().manual_seed(5)
    targets = random_targets(generator, [2, 3])
    pred, image = random_keypoints(generator, 2, 4), torch.tensor([0, 0, 1, 1, 1])
    labels, boxes = torch.cat([t.labels for t in targets]), torch.cat([t.boxes for t in targets])
    gt = torch.cat([t.keypoints for t in targets])
    plain = keypoint_costs(pred, image, labels, gt, boxes[:, 2] * boxes[:, 3], SCHEMA)
    weighted = make_criterion().matcher.keypoint_costs(pred, labels, boxes, gt, image)
    for coef, cost, term in zip(COEFS, plain, weighted):
        torch.testing.assert_close(term, coef * cost, rtol=1e-15, atol=0)


def test_non_finite_entries_are_left_out_of_values_and_gradients():
    generator = torch.Generator().manual_seed(6)
    target = random_targets(generator, [4])[0]
    target.labels[:] = 1  # four active slots each
    target.keypoints[..., 2] = 2
    clean = random_keypoints(generator, 4)
    poisoned = clean.clone()
    poisoned[0, 4, 0] = math.nan  # slot 0 of class 1: its location and NLL drop out
    poisoned[1, 5, 2] = math.inf  # its findable logit drops out
    poisoned[2, 6, 4] = 1000.0  # finite, but exp overflows: its NLL drops out
    poisoned[3, 7, 6] = -math.inf
    leaf = poisoned.clone().requires_grad_(True)
    pred, active = select_keypoints(leaf, target.labels, SCHEMA)
    area = target.boxes[:, 2] * target.boxes[:, 3]
    losses = torch.stack(keypoint_losses(pred, target.keypoints, active, area), 1)  # (4, 4)
    losses.sum().backward()
    assert losses.isfinite().all() and leaf.grad.isfinite().all()
    assert leaf.grad[0, 4, 0] == 0 and leaf.grad[1, 5, 2] == 0 and leaf.grad[2, 6, 4] == 0
    dropped = {(0, 0): [0, 3], (1, 1): [1], (2, 2): [3], (3, 3): [3]}  # pair, slot -> the terms it leaves
    for (pair, slot), terms in dropped.items():
        rows = clean[pair, 4:8].tolist()
        kept = [k for k in range(4) if k != slot]
        full = keypoint_pair_terms(rows, target.keypoints[pair].tolist(), 4, area[pair].item())
        for term in range(4):
            if term not in terms:
                assert losses[pair, term].item() == pytest.approx(full[term], rel=1e-12)
                continue
            # the dropped slot's term is the mean over the other three slots
            sub = keypoint_pair_terms([rows[k] for k in kept], [target.keypoints[pair, k].tolist() for k in kept], 3,
                                      area[pair].item())
            assert losses[pair, term].item() == pytest.approx(sub[term], rel=1e-12), (pair, term)


def test_labels_beyond_the_schema_cost_and_lose_nothing():
    generator = torch.Generator().manual_seed(7)
    target = random_targets(generator, [3])[0]
    target.labels[:] = torch.tensor([2, 3, 4])  # 0 keypoints, then beyond the schema
    pred = random_keypoints(generator, 1, 3)
    area = target.boxes[:, 2] * target.boxes[:, 3]
    costs = keypoint_costs(pred, torch.zeros(3, dtype=torch.int64), target.labels, target.keypoints, area, SCHEMA)
    assert all(torch.equal(cost, torch.zeros(3, 3, dtype=torch.float64)) for cost in costs)
    selected, active = select_keypoints(pred[0], target.labels, SCHEMA)
    assert not active.any()
    assert all(torch.equal(loss, torch.zeros(3, dtype=torch.float64))
               for loss in keypoint_losses(selected, target.keypoints, active, area))


def test_keypoint_terms_need_keypoint_outputs_and_targets():
    outputs, targets = make_case(8)
    bare = [Target(t.boxes, t.labels, t.image_id, t.orig_size, t.size) for t in targets]
    assert not any(name.startswith("loss_keypoints") for name in make_criterion()(outputs, bare, GROUPS).terms)
    mixed = [bare[0], *targets[1:]]
    with pytest.raises(ValueError, match=r"images \[0\] carry no keypoints"):
        make_criterion()(outputs, mixed, GROUPS)
    uneven = [Target(t.boxes, t.labels, t.image_id, t.orig_size, t.size, keypoints=t.keypoints[:1])
              for t in targets]
    with pytest.raises(ValueError, match="different number of keypoint sets"):
        make_criterion()(outputs, uneven, GROUPS)
    with pytest.raises(ValueError, match="num_keypoints_per_class"):
        SetCriterion(HungarianMatcher())(outputs, targets, GROUPS)
    for layer in (outputs, *outputs.aux_outputs, outputs.enc_outputs):
        layer.pred_keypoints = None
    assert set(make_criterion()(outputs, targets, GROUPS).terms) == {
        name + suffix for name in ("loss_ce", "loss_bbox", "loss_giou") for suffix in SUFFIXES}


def test_a_batch_without_targets_gives_zero_terms_still_connected():
    outputs, targets = make_case(9, sizes=(0, 0, 0))
    result = make_criterion()(outputs, targets, GROUPS)
    for suffix in SUFFIXES:
        assert all(result.terms[name + suffix].item() == 0 for name in NAMES)
    result.total.backward()
    assert torch.equal(outputs.pred_keypoints.grad, torch.zeros_like(outputs.pred_keypoints))


def test_the_unit_normaliser_gives_numerators():
    outputs, targets = make_case(10)
    normalised = make_criterion()(outputs, targets, GROUPS)
    numerators = make_criterion()(outputs, targets, GROUPS, num_boxes=torch.ones((), dtype=torch.float64))
    for name, value in normalised.terms.items():
        torch.testing.assert_close(numerators.terms[name] / (5 * GROUPS), value, rtol=1e-14, atol=0)


def test_bf16_keypoints_are_scored_in_fp32():
    outputs, targets = make_case(11)
    for layer in (outputs, *outputs.aux_outputs, outputs.enc_outputs):
        layer.pred_logits, layer.pred_boxes = layer.pred_logits.detach().float(), layer.pred_boxes.detach().float()
        layer.pred_keypoints = layer.pred_keypoints.detach().bfloat16()
    targets = [Target(t.boxes.float(), t.labels, t.image_id, t.orig_size, t.size, keypoints=t.keypoints.float())
               for t in targets]
    result = make_criterion()(outputs, targets, GROUPS)
    assert all(value.dtype == torch.float32 for value in result.terms.values())


def test_build_criterion_reads_the_keypoint_config(tiny_kwargs):
    model_config = ModelConfig(**tiny_kwargs, num_keypoints_per_class=[17])
    criterion = build_criterion(model_config, KeypointTrainConfig(dataset_dir=None, keypoint_nll_loss_coef=0.5))
    assert criterion.weights["loss_ce"] == 2.0
    assert [criterion.weights[name] for name in NAMES] == [1.0, 1.0, 1.0, 0.5]
    assert criterion.matcher.keypoint_weights == (1.0, 1.0, 1.0, 0.5)
    assert criterion.num_keypoints_per_class == criterion.matcher.num_keypoints_per_class == [17]
    plain = build_criterion(ModelConfig(**tiny_kwargs), TrainConfig(dataset_dir=None))
    assert [plain.weights[name] for name in NAMES] == [0.0] * 4 and plain.matcher.keypoint_weights == (0.0,) * 4
    assert plain.num_keypoints_per_class is None


def test_a_layout_other_than_the_schema_is_an_error():
    outputs, targets = make_case(12)
    criterion = SetCriterion(HungarianMatcher(num_keypoints_per_class=[3, 4]), num_keypoints_per_class=[3, 4])
    with pytest.raises(ValueError, match=r"predictions have 12 slots and targets 4; the schema \[3, 4\] needs 8 and 4"):
        criterion(outputs, targets, GROUPS)
