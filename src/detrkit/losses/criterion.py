"""Detection set loss: match every output layer to the targets and weigh its loss terms (spec 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from detrkit.config import ModelConfig, SegmentationTrainConfig, TrainConfig
from detrkit.losses.keypoints import check_layout, keypoint_losses, select_keypoints
from detrkit.losses.masks import pad_target_masks, point_mask_losses
from detrkit.losses.matcher import HungarianMatcher, Matches, at_least_fp32_masks
from detrkit.losses.terms import giou_box_loss, ia_bce_loss, l1_box_loss
from detrkit.losses.transfer import at_least_fp32, host_to_device
from detrkit.ops.boxes import cxcywh_to_xyxy, elementwise_box_iou
from detrkit.structures import DetectorOutput, MaskFactors, Target


@dataclass
class LossOutput:
    """total = Σ weight·term; terms unweighted, keyed `loss_ce`, `loss_ce_0`, `loss_ce_enc`, ...;
    class_error and cardinality_error (final layer, no grad) are for logging only."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor]
    class_error: torch.Tensor
    cardinality_error: torch.Tensor


def num_boxes_normaliser(targets: list[Target], groups: int, device: torch.device) -> torch.Tensor:
    """Σ #GT × groups, averaged over ranks, at least 1 (spec 7.2); filled on the device, so no host sync."""
    count = torch.full((), float(sum(len(t.labels) for t in targets) * groups), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
        count = count / dist.get_world_size()
    return count.clamp(min=1)


@dataclass
class LayerInputs:
    """One output layer as the losses read it: fp32 (or fp64) predictions, absent heads None."""

    suffix: str  # "" final, "_i" auxiliary decoder layer i, "_enc" encoder proposals
    logits: torch.Tensor  # (B, Q, C)
    boxes: torch.Tensor  # (B, Q, 4) cxcywh
    masks: torch.Tensor | MaskFactors | None
    keypoints: torch.Tensor | None  # (B, Q, C_kp·K, 8)


class SetCriterion:
    """Hungarian-matched IA-BCE, L1 and GIoU losses, plus point-sampled mask BCE and dice losses
    for segmentation outputs and keypoint L1, findable, visible and NLL losses for keypoint
    outputs, of the final, auxiliary and encoder outputs."""

    def __init__(self, matcher: HungarianMatcher, cls_loss_coef: float = 1.0, bbox_loss_coef: float = 5.0,
                 giou_loss_coef: float = 2.0, focal_alpha: float = 0.25, mask_ce_loss_coef: float = 5.0,
                 mask_dice_loss_coef: float = 5.0, mask_point_sample_ratio: int = 16,
                 num_keypoints_per_class: list[int] | None = None, keypoint_l1_loss_coef: float = 1.0,
                 keypoint_findable_loss_coef: float = 1.0, keypoint_visible_loss_coef: float = 1.0,
                 keypoint_nll_loss_coef: float = 1.0) -> None:
        self.matcher = matcher
        self.weights = {"loss_ce": cls_loss_coef, "loss_bbox": bbox_loss_coef, "loss_giou": giou_loss_coef,
                        "loss_mask_ce": mask_ce_loss_coef, "loss_mask_dice": mask_dice_loss_coef,
                        "loss_keypoints_l1": keypoint_l1_loss_coef,
                        "loss_keypoints_findable": keypoint_findable_loss_coef,
                        "loss_keypoints_visible": keypoint_visible_loss_coef,
                        "loss_keypoints_nll": keypoint_nll_loss_coef}
        self.focal_alpha = focal_alpha
        self.mask_point_sample_ratio = mask_point_sample_ratio
        self.num_keypoints_per_class = num_keypoints_per_class

    def __call__(self, outputs: DetectorOutput, targets: list[Target], groups: int,
                 image_size: tuple[int, int] | None = None, num_boxes: torch.Tensor | None = None) -> LossOutput:
        """groups: query groups G in training, 1 in evaluation (Q // num_queries). image_size: the
        padded input (H, W), needed when the outputs carry masks: target masks are padded to it.
        num_boxes: the normaliser; by default Σ #GT × groups over ranks (spec 7.2); ones give the
        numerators that manual accumulation divides itself (accumulation.py, spec 7.7).
        Computes in fp32 (or fp64) whatever the outputs' dtype."""
        layers = [_layer_inputs(suffix, layer) for suffix, layer in _layers(outputs)]
        target_masks = _target_masks(targets, image_size) if outputs.pred_masks is not None else None
        target_keypoints = _target_keypoints(targets) if outputs.pred_keypoints is not None else None
        if num_boxes is None:
            num_boxes = num_boxes_normaliser(targets, groups, outputs.pred_logits.device)
        labels = torch.cat([t.labels for t in targets])
        boxes = torch.cat([t.boxes for t in targets]).to(layers[0].boxes.dtype)
        matches = self.matcher.match_layers([(layer.logits, layer.boxes) for layer in layers], targets, groups,
                                            [layer.masks for layer in layers], target_masks,
                                            [layer.keypoints for layer in layers], target_keypoints)
        terms, total = {}, 0
        for layer, layer_matches in zip(layers, matches):
            layer_terms = self.layer_terms(layer.logits, layer.boxes, layer_matches, labels, boxes, num_boxes)
            if layer.masks is not None and target_masks is not None:
                layer_terms.update(self.mask_terms(layer.masks, layer_matches, target_masks, num_boxes))
            if layer.keypoints is not None and target_keypoints is not None:
                layer_terms.update(self.keypoint_terms(layer.keypoints, layer_matches, labels, boxes,
                                                       target_keypoints, num_boxes))
            for name, term in layer_terms.items():
                terms[name + layer.suffix] = term
                total = total + self.weights[name] * term
        errors = logging_errors(layers[0].logits, matches[0], labels, [len(t.labels) for t in targets])
        return LossOutput(total, terms, *errors)

    def layer_terms(self, logits: torch.Tensor, pred_boxes: torch.Tensor, matches: Matches, labels: torch.Tensor,
                    boxes: torch.Tensor, num_boxes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted loss_ce, loss_bbox, loss_giou of one output layer: logits (B, Q, C), pred_boxes (B, Q, 4)."""
        matched_boxes = pred_boxes.flatten(0, 1)[matches.query]  # (M, 4)
        target_boxes, target_labels = boxes[matches.target], labels[matches.target]
        iou = elementwise_box_iou(cxcywh_to_xyxy(matched_boxes.detach()), cxcywh_to_xyxy(target_boxes))
        return {
            "loss_ce": ia_bce_loss(logits, matches.query, target_labels, iou, num_boxes, self.focal_alpha),
            "loss_bbox": l1_box_loss(matched_boxes, target_boxes, num_boxes),
            "loss_giou": giou_box_loss(matched_boxes, target_boxes, num_boxes),
        }

    def mask_terms(self, pred_masks: torch.Tensor | MaskFactors, matches: Matches, target_masks: torch.Tensor,
                   num_boxes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted loss_mask_ce, loss_mask_dice of one output layer; target_masks (T, H, W) padded."""
        ce, dice = point_mask_losses(pred_masks, matches.query, matches.counts, target_masks, matches.target,
                                     num_boxes, self.mask_point_sample_ratio)
        return {"loss_mask_ce": ce, "loss_mask_dice": dice}

    def keypoint_terms(self, pred_keypoints: torch.Tensor, matches: Matches, labels: torch.Tensor,
                       boxes: torch.Tensor, target_keypoints: torch.Tensor,
                       num_boxes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted loss_keypoints_l1/findable/visible/nll of one output layer: each summed over
        the matched pairs / num_boxes; pred_keypoints (B, Q, C·K, 8), target_keypoints (T, K, 3)."""
        if not self.num_keypoints_per_class:
            raise ValueError("keypoint losses need num_keypoints_per_class (ModelConfig)")
        check_layout(pred_keypoints.shape[2], target_keypoints.shape[1], self.num_keypoints_per_class)
        matched_labels = labels[matches.target]
        pred, active = select_keypoints(pred_keypoints.flatten(0, 1)[matches.query], matched_labels,
                                        self.num_keypoints_per_class)  # (M, K, 8), (M, K)
        matched_boxes = boxes[matches.target]
        area = (matched_boxes[:, 2] * matched_boxes[:, 3]).to(pred.dtype)
        per_pair = keypoint_losses(pred, target_keypoints[matches.target], active, area)
        names = ("loss_keypoints_l1", "loss_keypoints_findable", "loss_keypoints_visible", "loss_keypoints_nll")
        return {name: loss.sum() / num_boxes for name, loss in zip(names, per_pair)}


def _layers(outputs: DetectorOutput) -> list[tuple[str, DetectorOutput]]:
    """(suffix, output) for the final layer, each auxiliary decoder layer and the encoder proposals."""
    layers = [("", outputs)] + [(f"_{i}", aux) for i, aux in enumerate(outputs.aux_outputs or [])]
    return layers + ([("_enc", outputs.enc_outputs)] if outputs.enc_outputs is not None else [])


def _layer_inputs(suffix: str, layer: DetectorOutput) -> LayerInputs:
    masks = None if layer.pred_masks is None else at_least_fp32_masks(layer.pred_masks)
    keypoints = None if layer.pred_keypoints is None else at_least_fp32(layer.pred_keypoints)
    return LayerInputs(suffix, at_least_fp32(layer.pred_logits), at_least_fp32(layer.pred_boxes), masks, keypoints)


def _target_masks(targets: list[Target], image_size: tuple[int, int] | None) -> torch.Tensor:
    """Every target mask padded to the input size, (T, H, W); segmentation outputs need both."""
    missing = [i for i, t in enumerate(targets) if t.masks is None]
    if missing:
        raise ValueError(f"the model predicts masks but the targets of images {missing} carry none; "
                         "segmentation training needs a mask per box")
    uneven = [i for i, t in enumerate(targets) if len(t.masks) != len(t.labels)]
    if uneven:
        raise ValueError(f"the targets of images {uneven} have a different number of masks and boxes")
    if image_size is None:
        raise ValueError("mask losses need image_size, the padded input (H, W), e.g. batch.pixels.shape[-2:]")
    return pad_target_masks([t.masks for t in targets], (int(image_size[0]), int(image_size[1])))


def _target_keypoints(targets: list[Target]) -> torch.Tensor | None:
    """Every target's keypoints, (T, K, 3); None when no image carries any (nothing to train them on)."""
    carried = [t.keypoints is not None for t in targets]
    if not any(carried):
        return None
    if not all(carried):
        missing = [i for i, has in enumerate(carried) if not has]
        raise ValueError(f"the targets of images {missing} carry no keypoints while others do")
    uneven = [i for i, t in enumerate(targets) if len(t.keypoints) != len(t.labels)]
    if uneven:
        raise ValueError(f"the targets of images {uneven} have a different number of keypoint sets and boxes")
    return torch.cat([t.keypoints for t in targets])


@torch.no_grad()
def logging_errors(logits: torch.Tensor, matches: Matches, labels: torch.Tensor,
                   sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """class_error: 100 − top-1 accuracy (%) of matched queries; cardinality_error: mean over images
    of |#queries with max σ > 0.5 − #GT|; logits (B, Q, C) of the final layer."""
    correct = logits.flatten(0, 1)[matches.query].argmax(-1) == labels[matches.target]
    class_error = 100 - 100 * correct.float().sum() / max(len(correct), 1)
    predicted = (logits.sigmoid().amax(-1) > 0.5).sum(1).float()  # (B,)
    cardinality_error = (predicted - host_to_device(torch.tensor(sizes), logits.device)).abs().mean()
    return class_error, cardinality_error


def build_criterion(model_config: ModelConfig, train_config: TrainConfig) -> SetCriterion:
    """The detection criterion; matcher costs, box weights and focal alpha are fixed (spec 1.4).
    Mask terms read the SegmentationTrainConfig fields; keypoint terms (costed and weighted alike,
    spec 9) the keypoint coefficients, 1 in KeypointTrainConfig and 0 in the base TrainConfig."""
    if not model_config.ia_bce_loss:
        raise NotImplementedError("only the IA-BCE classification loss (ia_bce_loss=True) is implemented; "
                                  "the sigmoid focal loss (ia_bce_loss=False) is not")
    coefficients = (train_config.keypoint_l1_loss_coef, train_config.keypoint_findable_loss_coef,
                    train_config.keypoint_visible_loss_coef, train_config.keypoint_nll_loss_coef)
    schema = list(model_config.num_keypoints_per_class) or None
    matcher_args = dict(zip(("cost_keypoint_l1", "cost_keypoint_findable", "cost_keypoint_visible",
                             "cost_keypoint_nll"), coefficients), num_keypoints_per_class=schema)
    criterion_args = dict(zip(("keypoint_l1_loss_coef", "keypoint_findable_loss_coef", "keypoint_visible_loss_coef",
                               "keypoint_nll_loss_coef"), coefficients), num_keypoints_per_class=schema)
    if isinstance(train_config, SegmentationTrainConfig):
        ratio = train_config.mask_point_sample_ratio
        matcher_args.update(cost_mask_ce=train_config.mask_ce_loss_coef,
                            cost_mask_dice=train_config.mask_dice_loss_coef, mask_point_sample_ratio=ratio)
        criterion_args.update(mask_ce_loss_coef=train_config.mask_ce_loss_coef,
                              mask_dice_loss_coef=train_config.mask_dice_loss_coef, mask_point_sample_ratio=ratio)
    return SetCriterion(HungarianMatcher(**matcher_args), cls_loss_coef=train_config.cls_loss_coef, **criterion_args)
