"""Collect an epoch's detections on the device and score them once: COCO mAP/mAR and best F1."""

from __future__ import annotations

import torch

from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.confidence_sweep import sweep_confidence


class DetectionEvaluator:
    """Accumulates per-image detections and ground truth without host syncs; `compute()` moves
    everything to the CPU once and returns metric name -> value."""

    def __init__(self, max_dets: int, backend: str = "vernier") -> None:
        self.max_dets, self.backend = max_dets, backend
        self._detections: list[dict[str, torch.Tensor]] = []
        self._truth: list[dict[str, torch.Tensor]] = []

    def add(self, detections: list[dict[str, torch.Tensor]], truth: list[dict[str, torch.Tensor]]) -> None:
        self._detections += [{k: v.detach() for k, v in d.items()} for d in detections]
        self._truth += [{k: v.detach() for k, v in t.items()} for t in truth]

    def compute(self) -> dict[str, float]:
        detections = [{k: v.cpu() for k, v in d.items()} for d in self._detections]
        truth = [{k: v.cpu() for k, v in t.items()} for t in self._truth]
        metric = OnePassCocoMeanAveragePrecision(iou_type="bbox", backend=self.backend,
                                                 max_detection_thresholds=[1, 10, self.max_dets])
        metric.update(detections, truth)
        result = metric.compute()
        sweep = sweep_confidence(detections, truth)
        return {"mAP_50_95": float(result["map"]), "mAP_50": float(result["map_50"]),
                "mAP_75": float(result["map_75"]), "mAR": float(result[f"mar_{self.max_dets}"]),
                "precision": sweep.best_precision, "recall": sweep.best_recall, "F1": sweep.best_f1}
