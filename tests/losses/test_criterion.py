"""SetCriterion against a loop twin over every output layer, its weights, normaliser and logs."""

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from detrkit.config import ModelConfig, TrainConfig
from detrkit.losses import criterion as criterion_module
from detrkit.losses.criterion import SetCriterion, build_criterion, num_boxes_normaliser
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, Target
from twins import box_losses, ia_bce, iou_giou, match_groups, xyxy

GROUPS, BLOCK, CLASSES = 3, 4, 5
SUFFIXES = ["", "_0", "_1", "_enc"]  # dec_layers = 3: two auxiliary layers


def layer(generator, batch):
    logits = torch.randn(batch, GROUPS * BLOCK, CLASSES, generator=generator, dtype=torch.float64) * 2
    boxes = torch.rand(batch, GROUPS * BLOCK, 4, generator=generator, dtype=torch.float64) * 0.6 + 0.1
    return DetectorOutput(logits.requires_grad_(True), boxes.requires_grad_(True))


def make_case(seed, sizes=(2, 0, 3)):
    generator = torch.Generator().manual_seed(seed)
    outputs = layer(generator, len(sizes))
    outputs.aux_outputs = [layer(generator, len(sizes)) for _ in range(2)]
    outputs.enc_outputs = layer(generator, len(sizes))
    targets = [Target(torch.rand(n, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2,
                      torch.randint(0, CLASSES, (n,), generator=generator), i, (64, 64), (64, 64))
               for i, n in enumerate(sizes)]
    return outputs, targets


def twin_terms(output, targets, groups, num_boxes):
    """loss_ce, loss_bbox, loss_giou of one layer, image by image and element by element."""
    ce = l1 = giou = 0.0
    for i, target in enumerate(targets):
        logits, boxes = output.pred_logits[i].tolist(), output.pred_boxes[i].tolist()
        labels, gt = target.labels.tolist(), target.boxes.tolist()
        matched = match_groups(logits, boxes, labels, gt, groups)
        ce += ia_bce(logits, {q: (labels[j], iou_giou(xyxy(boxes[q]), xyxy(gt[j]))[0]) for q, j in matched.items()})
        pair_l1, pair_giou = box_losses([(boxes[q], gt[j]) for q, j in matched.items()])
        l1, giou = l1 + pair_l1, giou + pair_giou
    return {"loss_ce": ce / num_boxes, "loss_bbox": l1 / num_boxes, "loss_giou": giou / num_boxes}


@pytest.mark.parametrize("seed", range(3))
def test_every_layer_matches_the_loop_twin(seed):
    outputs, targets = make_case(seed)
    result = SetCriterion(HungarianMatcher())(outputs, targets, GROUPS)
    layers = dict(zip(SUFFIXES, [outputs, *outputs.aux_outputs, outputs.enc_outputs]))
    for suffix, output in layers.items():
        for name, value in twin_terms(output, targets, GROUPS, num_boxes=5 * GROUPS).items():
            assert abs(result.terms[name + suffix].item() - value) < 1e-9, name + suffix


def test_total_is_the_weighted_sum_over_every_suffix(tiny_kwargs):
    outputs, targets = make_case(0)
    criterion = build_criterion(ModelConfig(**tiny_kwargs), TrainConfig(dataset_dir=None, cls_loss_coef=2.0))
    result = criterion(outputs, targets, GROUPS)
    names = ["loss_ce", "loss_bbox", "loss_giou"]
    assert set(result.terms) == {n + s for n in names for s in SUFFIXES}
    weights = {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    expected = sum(weights[n] * result.terms[n + s] for n in names for s in SUFFIXES)
    torch.testing.assert_close(result.total, expected)


def test_only_present_outputs_get_terms():
    outputs, targets = make_case(1)
    outputs.aux_outputs, outputs.enc_outputs = None, None
    assert set(SetCriterion(HungarianMatcher())(outputs, targets, GROUPS).terms) == {"loss_ce", "loss_bbox", "loss_giou"}


@pytest.mark.parametrize("sizes", [(2, 0, 3), (0, 0)])
def test_backward_reaches_every_output_even_without_targets(sizes):
    outputs, targets = make_case(2, sizes)
    result = SetCriterion(HungarianMatcher())(outputs, targets, GROUPS)
    result.total.backward()
    for output in [outputs, *outputs.aux_outputs, outputs.enc_outputs]:
        assert output.pred_logits.grad.abs().sum() > 0 and torch.isfinite(output.pred_boxes.grad).all()
    if sum(sizes) == 0:  # background only: the negative class loss, box terms exactly zero
        assert all(result.terms[f"loss_{n}{s}"].item() == 0 for n in ("bbox", "giou") for s in SUFFIXES)
        assert outputs.pred_boxes.grad.eq(0).all()


def test_normaliser_counts_every_group_and_is_at_least_one(tmp_path):
    _, targets = make_case(0, (2, 0, 3))
    assert num_boxes_normaliser(targets, 3, torch.device("cpu")).item() == 15.0
    _, empty = make_case(0, (0, 0))
    assert num_boxes_normaliser(empty, 13, torch.device("cpu")).item() == 1.0
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:  # all-reduced sum / world size: unchanged on one rank
        assert num_boxes_normaliser(targets, 3, torch.device("cpu")).item() == 15.0
    finally:
        dist.destroy_process_group()


def test_class_and_cardinality_errors_on_a_constructed_case():
    gt = torch.tensor([[0.2, 0.2, 0.1, 0.1], [0.5, 0.5, 0.2, 0.2], [0.8, 0.8, 0.1, 0.1]], dtype=torch.float64)
    targets = [Target(gt[:1], torch.tensor([1]), 0, (8, 8), (8, 8)), Target(gt[1:], torch.tensor([2, 0]), 1, (8, 8), (8, 8))]
    boxes = torch.stack([gt, gt.flip(0)])  # image 0: query 0 sits on its target; image 1: queries 1, 0
    logits = torch.full((2, 3, 3), -4.0, dtype=torch.float64)
    logits[0, 0, 1] = logits[0, 2, 0] = 3.0  # image 0: correct, plus one extra confident query
    logits[1, 1, 2] = 3.0  # image 1: query 1 correct (label 2); query 0 (label 0) predicts class 1
    logits[1, 0, 1] = 0.0  # σ = 0.5 is not > 0.5
    result = SetCriterion(HungarianMatcher())(DetectorOutput(logits, boxes), targets, groups=1)
    torch.testing.assert_close(result.class_error, torch.tensor(100 / 3))  # 2 of 3 matched queries right
    torch.testing.assert_close(result.cardinality_error, torch.tensor(1.0))  # |2 − 1| and |1 − 2|
    assert not result.class_error.requires_grad and not result.cardinality_error.requires_grad


def test_build_criterion_reads_the_class_weight_and_rejects_focal_loss(tiny_kwargs):
    criterion = build_criterion(ModelConfig(**tiny_kwargs), TrainConfig(dataset_dir=None, cls_loss_coef=2.0))
    assert criterion.weights == {"loss_ce": 2.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_mask_ce": 5.0,
                                 "loss_mask_dice": 5.0, "loss_keypoints_l1": 0.0, "loss_keypoints_findable": 0.0,
                                 "loss_keypoints_visible": 0.0, "loss_keypoints_nll": 0.0}
    with pytest.raises(NotImplementedError, match="ia_bce_loss=False"):
        build_criterion(ModelConfig(**tiny_kwargs, ia_bce_loss=False), TrainConfig(dataset_dir=None))


def test_only_the_matcher_moves_to_the_host():
    package = Path(criterion_module.__file__).parent
    syncing = {path.name for path in package.glob("*.py") if re.search(r"\.(item|cpu|tolist|numpy)\(", path.read_text())}
    assert syncing == {"matcher.py"}


def cast_outputs(outputs, dtype):
    """A detached copy of every output layer in `dtype`."""
    copy = lambda o: DetectorOutput(o.pred_logits.detach().to(dtype), o.pred_boxes.detach().to(dtype))  # noqa: E731
    cast = copy(outputs)
    cast.aux_outputs, cast.enc_outputs = [copy(o) for o in outputs.aux_outputs], copy(outputs.enc_outputs)
    return cast


@pytest.mark.parametrize("seed", [0, 2, 3])  # seeds whose assignment bf16 rounding leaves unchanged
def test_bf16_outputs_are_scored_in_fp32(seed):
    """Under bf16 autocast the heads emit bf16: the criterion upcasts, so its terms are float32 and
    exactly those of the same values in fp32, within 0.5% of the unrounded outputs' terms."""
    outputs, targets = make_case(seed)
    targets = [Target(t.boxes.float(), t.labels, t.image_id, t.orig_size, t.size) for t in targets]
    criterion = SetCriterion(HungarianMatcher())
    half = criterion(cast_outputs(outputs, torch.bfloat16), targets, GROUPS)
    upcast = criterion(cast_outputs(cast_outputs(outputs, torch.bfloat16), torch.float32), targets, GROUPS)
    full = criterion(cast_outputs(outputs, torch.float32), targets, GROUPS)
    values = [half.total, half.class_error, half.cardinality_error, *half.terms.values()]
    assert all(value.dtype == torch.float32 for value in values)
    for name, value in half.terms.items():
        assert torch.equal(value, upcast.terms[name]), name
        torch.testing.assert_close(value, full.terms[name], rtol=5e-3, atol=0, msg=name)
