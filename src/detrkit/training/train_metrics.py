"""compute_train_metrics=True: COCO box mAP of the training batches as they are trained on."""

from __future__ import annotations

import torch

from detrkit.models.postprocess import top_detections
from detrkit.ops.boxes import cxcywh_to_xyxy
from detrkit.structures import Batch
from detrkit.training.evaluation import DetectionEvaluator


class TrainingSetMetrics:
    """Scores each training step's predictions for its own (augmented) images: the final layer's
    first query group, the group that validation and predict() use, in the pixels of the
    transformed image that the boxes are normalised to. Boxes only (masks and keypoints are
    scored in validation); crowd regions, kept in source-image pixels, are left out. The
    predictions are those of the weights before the step's update, so the epoch's number trails
    the weights it ends with; compare it with validation's to see over- or under-fitting."""

    def __init__(self, max_dets: int, backend: str, num_queries: int, num_select: int) -> None:
        self.max_dets, self.backend = max_dets, backend
        self.num_queries, self.num_select = num_queries, num_select
        self.evaluator = DetectionEvaluator(max_dets, backend)

    @torch.no_grad()
    def add(self, outputs, batch: Batch) -> None:
        logits = outputs.pred_logits[:, :self.num_queries].float()
        boxes = outputs.pred_boxes[:, :self.num_queries].float()
        sizes = torch.tensor([target.size for target in batch.targets]).to(logits.device, non_blocking=True)
        detections = top_detections(logits, boxes, sizes, self.num_select)
        truth = []
        for target in batch.targets:
            height, width = target.size
            pixels = cxcywh_to_xyxy(target.boxes.float()) * target.boxes.new_tensor([width, height, width, height])
            truth.append({"boxes": pixels, "labels": target.labels,
                          "area": pixels.new_zeros(len(target.labels)),  # 0: the metric takes the box's
                          "iscrowd": target.labels.new_zeros(len(target.labels))})
        self.evaluator.add(detections, truth)

    def take(self) -> DetectionEvaluator:
        """The epoch's evaluator, gathered over processes (every process must call this), and a
        fresh one for the next epoch."""
        evaluator, self.evaluator = self.evaluator, DetectionEvaluator(self.max_dets, self.backend)
        evaluator.gather()
        return evaluator

    def state_dict(self) -> dict[str, list[dict[str, torch.Tensor]]]:
        """This process's images of the epoch so far, for a checkpoint written mid-epoch."""
        return {"detections": self.evaluator.detections, "truth": self.evaluator.truth}

    def load_state_dict(self, state: dict[str, list[dict[str, torch.Tensor]]]) -> None:
        self.evaluator.add(state["detections"], state["truth"])
