"""Detection set loss: match every output layer to the targets and weigh its loss terms (spec 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from detrkit.config import ModelConfig, TrainConfig
from detrkit.losses.matcher import HungarianMatcher, Matches, at_least_fp32, host_to_device
from detrkit.losses.terms import giou_box_loss, ia_bce_loss, l1_box_loss
from detrkit.ops.boxes import cxcywh_to_xyxy, elementwise_box_iou
from detrkit.structures import DetectorOutput, Target


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


class SetCriterion:
    """Hungarian-matched IA-BCE, L1 and GIoU losses for the final, auxiliary and encoder outputs."""

    def __init__(self, matcher: HungarianMatcher, cls_loss_coef: float = 1.0, bbox_loss_coef: float = 5.0,
                 giou_loss_coef: float = 2.0, focal_alpha: float = 0.25) -> None:
        self.matcher = matcher
        self.weights = {"loss_ce": cls_loss_coef, "loss_bbox": bbox_loss_coef, "loss_giou": giou_loss_coef}
        self.focal_alpha = focal_alpha

    def __call__(self, outputs: DetectorOutput, targets: list[Target], groups: int) -> LossOutput:
        """groups: query groups G in training, 1 in evaluation (Q // num_queries). Computes in fp32
        (or fp64) whatever the outputs' dtype."""
        layers = [(suffix, at_least_fp32(layer.pred_logits), at_least_fp32(layer.pred_boxes))
                  for suffix, layer in _layers(outputs)]
        num_boxes = num_boxes_normaliser(targets, groups, outputs.pred_logits.device)
        labels = torch.cat([t.labels for t in targets])
        boxes = torch.cat([t.boxes for t in targets]).to(layers[0][2].dtype)
        matches = self.matcher.match_layers([(logits, pred) for _, logits, pred in layers], targets, groups)
        terms, total = {}, 0
        for (suffix, logits, pred), layer_matches in zip(layers, matches):
            for name, term in self.layer_terms(logits, pred, layer_matches, labels, boxes, num_boxes).items():
                terms[name + suffix] = term
                total = total + self.weights[name] * term
        errors = logging_errors(layers[0][1], matches[0], labels, [len(t.labels) for t in targets])
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


def _layers(outputs: DetectorOutput) -> list[tuple[str, DetectorOutput]]:
    """(suffix, output) for the final layer, each auxiliary decoder layer and the encoder proposals."""
    layers = [("", outputs)] + [(f"_{i}", aux) for i, aux in enumerate(outputs.aux_outputs or [])]
    return layers + ([("_enc", outputs.enc_outputs)] if outputs.enc_outputs is not None else [])


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
    """The detection criterion; matcher costs, box weights and focal alpha are fixed (spec 1.4)."""
    if not model_config.ia_bce_loss:
        raise NotImplementedError("only the IA-BCE classification loss (ia_bce_loss=True) is implemented; "
                                  "the sigmoid focal loss (ia_bce_loss=False) is not")
    return SetCriterion(HungarianMatcher(), cls_loss_coef=train_config.cls_loss_coef)
