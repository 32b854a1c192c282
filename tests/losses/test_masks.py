"""Mask costs and losses (spec 8.2, 8.3) against the point-by-point twins, in float64; padding,
the matched-only evaluation of factored masks, the no-match zero and the criterion's wiring."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from detrkit.losses.criterion import SetCriterion
from detrkit.losses.masks import (matched_mask_logits, pad_target_masks, pairwise_mask_costs, point_mask_losses,
                                  point_sample, target_point_labels)
from detrkit.losses.matcher import HungarianMatcher
from detrkit.structures import DetectorOutput, MaskFactors, Target
from twins import bilinear_at, brute_force_assign, factor_mask, mask_pair_cost, mask_pair_loss, nearest_at, pair_cost

DIM, HEIGHT, WIDTH = 3, 6, 5  # mask features (B, DIM, HEIGHT, WIDTH)
IMAGE = (12, 10)  # the padded input
MASK_SIZES = [(12, 10), (9, 10), (12, 7)]  # each image's unpadded size


def random_factors(generator, batch, queries, dtype=torch.float64):
    spatial = torch.randn(batch, DIM, HEIGHT, WIDTH, generator=generator, dtype=dtype)
    return MaskFactors(spatial, torch.randn(batch, queries, DIM, generator=generator, dtype=dtype) * 0.7,
                       torch.randn(1, generator=generator, dtype=dtype) * 0.3)


def random_masks(generator, sizes):
    return [torch.rand(n, *size, generator=generator) > 0.5 for n, size in zip(sizes, MASK_SIZES)]


def as_lists(factors, image, query):
    return factor_mask(factors.spatial[image].tolist(), factors.queries[image, query].tolist(), factors.bias.item())


def test_point_sample_matches_the_bilinear_and_nearest_twins():
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2, 1, 5, 7, generator=generator, dtype=torch.float64)
    points = torch.rand(2, 40, 2, generator=generator)
    points[:, :4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.03, 0.97], [0.5, 0.5]])  # corners: border padding
    for mode, twin in (("bilinear", bilinear_at), ("nearest", nearest_at)):
        sampled = point_sample(images, points, mode)
        assert sampled.shape == (2, 1, 40) and sampled.dtype == torch.float64
        for n in range(2):
            expected = [twin(images[n, 0].tolist(), *p) for p in points[n].tolist()]
            torch.testing.assert_close(sampled[n, 0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_target_masks_are_padded_bottom_right_to_the_input():
    masks = random_masks(torch.Generator().manual_seed(1), [2, 0, 1])
    padded = pad_target_masks(masks, IMAGE)
    assert padded.shape == (3, *IMAGE) and padded.dtype == torch.bool
    assert torch.equal(padded[:2], masks[0]) and torch.equal(padded[2, :12, :7], masks[2][0])
    assert not padded[2, :, 7:].any()
    same = [m[:, :9, :7] for m in masks]
    assert torch.equal(pad_target_masks(same, (9, 7)), torch.cat(same))
    with pytest.raises(ValueError, match=r"image 0: target masks of \(12, 10\) exceed"):
        pad_target_masks(masks, (11, 10))


@pytest.mark.parametrize("dense", [False, True])
def test_matcher_mask_costs_match_the_twin(dense):
    generator = torch.Generator().manual_seed(2)
    factors, image = random_factors(generator, 2, 4), torch.tensor([0, 0, 1])
    target_masks = pad_target_masks(random_masks(generator, [2, 1]), IMAGE)
    matcher = HungarianMatcher(mask_point_sample_ratio=3)
    torch.manual_seed(5)
    ce, dice = matcher.mask_costs(factors.dense() if dense else factors, target_masks, image)
    torch.manual_seed(5)
    points = torch.rand(1, HEIGHT * WIDTH // 3, 2)[0].tolist()  # the one shared draw
    for q in range(4):
        for j, i in enumerate(image.tolist()):
            mask, target = as_lists(factors, i, q), target_masks[j].double().tolist()
            pair = mask_pair_cost([bilinear_at(mask, *p) for p in points], [nearest_at(target, *p) for p in points])
            assert abs(ce[q, j].item() - 5 * pair[0]) < 1e-10 and abs(dice[q, j].item() - 5 * pair[1]) < 1e-10


def test_pairwise_costs_of_extreme_logits_stay_finite():
    logits = torch.tensor([[80.0, -80.0, 0.0]], dtype=torch.float64)
    ce, dice = pairwise_mask_costs(logits, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    assert torch.isfinite(ce).all() and torch.isfinite(dice).all()
    assert abs(ce[0, 1].item() - 160 / 3 - mask_pair_cost([0.0], [0.0])[0] / 3) < 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_matcher_with_masks_equals_brute_force(seed):
    generator = torch.Generator().manual_seed(seed)
    groups, block, sizes = 2, 3, [2, 0, 3]
    logits = torch.randn(3, groups * block, 4, generator=generator, dtype=torch.float64) * 2
    boxes = torch.rand(3, groups * block, 4, generator=generator, dtype=torch.float64) * 0.6 + 0.1
    masks = random_masks(generator, sizes)
    targets = [Target(torch.rand(n, 4, generator=generator, dtype=torch.float64) * 0.5 + 0.2,
                      torch.randint(0, 4, (n,), generator=generator), i, IMAGE, IMAGE, masks=m)
               for i, (n, m) in enumerate(zip(sizes, masks))]
    factors, target_masks = random_factors(generator, 3, groups * block), pad_target_masks(masks, IMAGE)
    torch.manual_seed(seed)
    matches = HungarianMatcher(mask_point_sample_ratio=2)(logits, boxes, targets, groups, factors, target_masks)
    torch.manual_seed(seed)
    points = torch.rand(1, HEIGHT * WIDTH // 2, 2)[0].tolist()
    assert matches.counts == [groups * n for n in sizes]
    queries = groups * block
    found = {divmod(q, queries): t for q, t in zip(matches.query.tolist(), matches.target.tolist())}
    start = 0
    for i, target in enumerate(targets):
        for g in range(groups):
            cost = [[total_cost(logits, boxes, factors, target, target_masks[start + j], i, g * block + q, j, points)
                     for j in range(sizes[i])] for q in range(block)]
            for j, q in brute_force_assign(cost)[1].items():
                assert found[(i, g * block + q)] == start + j
        start += sizes[i]


def total_cost(logits, boxes, factors, target, mask, image, query, j, points):
    mask_logits = [bilinear_at(as_lists(factors, image, query), *p) for p in points]
    ce, dice = mask_pair_cost(mask_logits, [nearest_at(mask.double().tolist(), *p) for p in points])
    box_cost = pair_cost(logits[image, query].tolist(), boxes[image, query].tolist(), target.labels[j].item(),
                         target.boxes[j].tolist())
    return box_cost + 5 * ce + 5 * dice


MATCHED_QUERY = torch.tensor([1, 3, 5, 9, 7])  # 5 queries per image: image 0 queries 1, 3; image 1 queries 0, 4, 2
MATCHED_TARGET = torch.tensor([1, 0, 2, 4, 3])
COUNTS = [2, 3]


@pytest.mark.parametrize("ratio", [16, 2])  # max(h, h·w // ratio) points: h, then h·w // 2
@pytest.mark.parametrize("seed", range(2))
def test_point_mask_losses_match_the_twin(seed, ratio):
    generator = torch.Generator().manual_seed(seed)
    factors = random_factors(generator, 2, 5)
    target_masks = pad_target_masks(random_masks(generator, [2, 3]), IMAGE)
    num_boxes = torch.tensor(4.0, dtype=torch.float64)
    torch.manual_seed(seed)
    ce, dice = point_mask_losses(factors, MATCHED_QUERY, COUNTS, target_masks, MATCHED_TARGET, num_boxes, ratio)
    num_points = max(HEIGHT, HEIGHT * WIDTH // ratio)
    torch.manual_seed(seed)
    candidates = torch.rand(5, 3 * num_points, 2).tolist()
    fresh = torch.rand(5, num_points - int(0.75 * num_points), 2).tolist()
    ce_twin = dice_twin = 0.0
    for m, (q, t) in enumerate(zip(MATCHED_QUERY.tolist(), MATCHED_TARGET.tolist())):
        mask, target = as_lists(factors, q // 5, q % 5), target_masks[t].double().tolist()
        pair = mask_pair_loss(mask, target, [tuple(p) for p in candidates[m]], [tuple(p) for p in fresh[m]], num_points)
        ce_twin, dice_twin = ce_twin + pair[0], dice_twin + pair[1]
    assert abs(ce.item() - ce_twin / 4) < 1e-10 and abs(dice.item() - dice_twin / 4) < 1e-10


class ShapeRecorder(TorchFunctionMode):
    """Records the shape of every tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple) else (out,)
        self.shapes += [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        return out


def test_factored_masks_are_multiplied_out_for_matched_queries_only():
    generator = torch.Generator().manual_seed(3)
    factors = random_factors(generator, 2, 5)
    with ShapeRecorder() as recorder:
        logits = matched_mask_logits(factors, MATCHED_QUERY, COUNTS)
    assert logits.shape == (5, HEIGHT, WIDTH) and (2, 5, HEIGHT, WIDTH) not in recorder.shapes
    torch.testing.assert_close(logits, factors.dense().flatten(0, 1)[MATCHED_QUERY], rtol=0, atol=1e-12)
    assert torch.equal(matched_mask_logits(factors.dense(), MATCHED_QUERY, COUNTS),
                       factors.dense().flatten(0, 1)[MATCHED_QUERY])
    three = random_factors(generator, 3, 5)  # uneven counts, an image without matches, a query twice
    matched = torch.tensor([4, 0, 4, 13])
    torch.testing.assert_close(matched_mask_logits(three, matched, [3, 0, 1]), three.dense().flatten(0, 1)[matched],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("size", [(12, 10), (7, 5), (312, 312), (480, 640)])
def test_labels_are_grid_samples_nearest_pixels_read_by_index(size):
    """Indexing reads the very pixels grid_sample's nearest mode (border, align_corners=False)
    picks, also on pixel edges and centres, where rounding half to even decides, and the corners."""
    generator = torch.Generator().manual_seed(4)
    height, width = size
    masks = torch.rand(6, height, width, generator=generator) > 0.5
    points = torch.rand(6, 3000, 2, generator=generator)
    columns = torch.randint(0, width + 1, (6, 500), generator=generator).float()
    rows = torch.randint(0, height + 1, (6, 500), generator=generator).float()
    points[:, :500, 0], points[:, :500, 1] = columns / width, rows / height  # pixel edges
    points[:, 500:1000, 0], points[:, 500:1000, 1] = (columns + 0.5) / width, (rows + 0.5) / height  # centres
    points[:, 1000:1004] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    expected = point_sample(masks[:, None].float(), points, mode="nearest")[:, 0]
    assert torch.equal(target_point_labels(masks, points), expected)
    chosen = torch.tensor([5, 0, 0, 2])  # one row per point set, repeats allowed
    assert torch.equal(target_point_labels(masks, points[:4], rows=chosen),
                       point_sample(masks[chosen, None].float(), points[:4], mode="nearest")[:, 0])


@pytest.mark.parametrize("dense", [False, True])
def test_no_match_gives_zero_losses_connected_to_every_mask_input(dense):
    factors = random_factors(torch.Generator().manual_seed(5), 2, 5)
    for tensor in (factors.spatial, factors.queries, factors.bias):
        tensor.requires_grad_(True)
    pred = factors.dense() if dense else factors
    empty = torch.zeros(0, dtype=torch.int64)
    ce, dice = point_mask_losses(pred, empty, [0, 0], torch.zeros(0, *IMAGE, dtype=torch.bool), empty,
                                 torch.tensor(1.0), 16)
    (ce + dice).backward()
    assert ce.item() == dice.item() == 0.0
    assert all(t.grad is not None and t.grad.eq(0).all() for t in (factors.spatial, factors.queries, factors.bias))


def segmentation_case(seed, sizes=(2, 0, 3), groups=2, block=4, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)

    def layer():
        logits = torch.randn(len(sizes), groups * block, 5, generator=generator, dtype=dtype) * 2
        boxes = torch.rand(len(sizes), groups * block, 4, generator=generator, dtype=dtype) * 0.6 + 0.1
        return DetectorOutput(logits, boxes, pred_masks=random_factors(generator, len(sizes), groups * block, dtype))

    outputs = layer()
    outputs.aux_outputs, outputs.enc_outputs = [layer(), layer()], layer()
    masks = random_masks(generator, sizes)
    targets = [Target(torch.rand(n, 4, generator=generator, dtype=dtype) * 0.5 + 0.2,
                      torch.randint(0, 5, (n,), generator=generator), i, MASK_SIZES[i], MASK_SIZES[i], masks=m)
               for i, (n, m) in enumerate(zip(sizes, masks))]
    return outputs, targets


def test_every_output_layer_gets_weighted_mask_terms():
    outputs, targets = segmentation_case(6)
    criterion = SetCriterion(HungarianMatcher(), mask_ce_loss_coef=3.0, mask_dice_loss_coef=0.5)
    result = criterion(outputs, targets, 2, image_size=IMAGE)
    suffixes = ["", "_0", "_1", "_enc"]
    names = ["loss_ce", "loss_bbox", "loss_giou", "loss_mask_ce", "loss_mask_dice"]
    assert set(result.terms) == {n + s for n in names for s in suffixes}
    weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_mask_ce": 3.0, "loss_mask_dice": 0.5}
    torch.testing.assert_close(result.total, sum(weights[n] * result.terms[n + s] for n in names for s in suffixes))


def test_masks_need_both_sides_and_the_input_size():
    outputs, targets = segmentation_case(7)
    with pytest.raises(ValueError, match="image_size"):
        SetCriterion(HungarianMatcher())(outputs, targets, 2)
    unmasked = [Target(t.boxes, t.labels, t.image_id, t.orig_size, t.size) for t in targets]
    with pytest.raises(ValueError, match=r"images \[0, 1, 2\] carry none"):
        SetCriterion(HungarianMatcher())(outputs, unmasked, 2, image_size=IMAGE)
    uneven = [Target(t.boxes, t.labels, t.image_id, t.orig_size, t.size, masks=t.masks[:1]) for t in targets]
    with pytest.raises(ValueError, match=r"images \[0, 2\] have a different number of masks and boxes"):
        SetCriterion(HungarianMatcher())(outputs, uneven, 2, image_size=IMAGE)
    for layer in [outputs, *outputs.aux_outputs, outputs.enc_outputs]:  # a detector on segmentation data
        layer.pred_masks = None
    terms = SetCriterion(HungarianMatcher())(outputs, targets, 2).terms
    assert not any("mask" in name for name in terms)


def test_bf16_mask_factors_are_scored_in_fp32():
    outputs, targets = segmentation_case(8, dtype=torch.float32)
    for layer in [outputs, *outputs.aux_outputs, outputs.enc_outputs]:
        f = layer.pred_masks
        layer.pred_masks = MaskFactors(f.spatial.bfloat16(), f.queries.bfloat16(), f.bias.bfloat16())
    terms = SetCriterion(HungarianMatcher())(outputs, targets, 2, image_size=IMAGE).terms
    assert all(terms[n].dtype == torch.float32 for n in ("loss_mask_ce", "loss_mask_dice_enc"))
