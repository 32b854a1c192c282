"""Evaluation through a package that follows pycocotools' object model (COCO, loadRes, COCOeval).

The ground truth is one COCO dataset dict, the detections go through loadRes exactly as a
results file would (box rows for bbox, so area = w * h; masks alone for segm, so area is the
mask's; keypoints alone, so area is their extent's), and Params get the metric's grid, category
ids and keypoint sigmas before evaluate() and accumulate().
"""

from __future__ import annotations

from abc import abstractmethod
from types import ModuleType
from typing import Any

import numpy as np

from detrkit.training.coco_backends.base import Accumulation, CocoBackend, CocoInputs, EvalGrid


class PackageCocoBackend(CocoBackend):
    """A backend driven through COCO(), loadRes(), COCOeval and the package's RLE module."""

    @abstractmethod
    def _package(self) -> tuple[type, type, ModuleType]:
        """The package's COCO class, COCOeval class and mask (RLE) module."""

    def _evaluator(self, coco_eval: type, gt: Any, dt: Any, iou_type: str) -> Any:
        return coco_eval(gt, dt, iou_type)

    def _ground_truth(self, inputs: CocoInputs) -> Any:
        coco, _, mask = self._package()
        return coco(coco_dataset(inputs, compressed_rles(mask, inputs.gt_rles, inputs.gt_sizes())))

    def _detections(self, gt: Any, inputs: CocoInputs) -> Any:
        if inputs.iou_type == "bbox":
            return gt.loadRes(inputs.detection_matrix())
        if inputs.iou_type == "keypoints":
            return gt.loadRes(inputs.keypoint_results())
        _, _, mask = self._package()
        rles = compressed_rles(mask, inputs.dt_rles, inputs.dt_sizes())
        return gt.loadRes(segmentation_results(inputs, rles))

    def accumulate(self, inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
        _, coco_eval, _ = self._package()
        gt = self._ground_truth(inputs)
        evaluator = self._evaluator(coco_eval, gt, self._detections(gt, inputs), inputs.iou_type)
        params = evaluator.params
        params.catIds = inputs.category_ids.tolist()
        params.iouThrs = np.asarray(grid.iou_thresholds, dtype=np.float64)
        params.recThrs = np.asarray(grid.recall_thresholds, dtype=np.float64)
        params.maxDets = list(grid.max_dets)
        if inputs.iou_type == "keypoints":
            params.kpt_oks_sigmas = inputs.keypoint_sigmas
        evaluator.evaluate()
        evaluator.accumulate()
        result = evaluator.eval
        return Accumulation(np.asarray(result["precision"], np.float64), np.asarray(result["recall"], np.float64))


def coco_dataset(inputs: CocoInputs, rles: list[dict] | None) -> dict:
    """The ground truth as a COCO annotation-file dict (ids 1-based, boxes xywh, keypoints flat)."""
    images = [
        {"id": image_id, "height": height, "width": width}
        for image_id, (height, width) in zip(inputs.image_ids.tolist(), inputs.image_sizes.tolist())
    ]
    annotations = [
        {"id": ann_id, "image_id": image_id, "category_id": category, "bbox": box, "area": area, "iscrowd": crowd}
        for ann_id, image_id, category, box, area, crowd in zip(
            inputs.gt_ids.tolist(),
            inputs.gt_image_ids.tolist(),
            inputs.gt_category_ids.tolist(),
            inputs.gt_boxes.tolist(),
            inputs.gt_areas.tolist(),
            inputs.gt_crowd.tolist(),
        )
    ]
    if rles is not None:
        for annotation, rle in zip(annotations, rles):
            annotation["segmentation"] = rle
    if inputs.gt_keypoints is not None:
        keypoints = inputs.gt_keypoints.reshape(len(annotations), -1).tolist()
        for annotation, flat, count in zip(annotations, keypoints, inputs.gt_num_keypoints().tolist()):
            annotation["keypoints"], annotation["num_keypoints"] = flat, count
    categories = [{"id": category, "name": str(category)} for category in inputs.category_ids.tolist()]
    return {"images": images, "annotations": annotations, "categories": categories}


def segmentation_results(inputs: CocoInputs, rles: list[dict]) -> list[dict]:
    """Mask detections as a segm results file holds them: no box, so loadRes takes the mask's area."""
    return [
        {"image_id": image_id, "category_id": category, "score": score, "segmentation": rle}
        for image_id, category, score, rle in zip(
            inputs.dt_image_ids.tolist(), inputs.dt_category_ids.tolist(), inputs.dt_scores.tolist(), rles
        )
    ]


def compressed_rles(mask: ModuleType, runs: list[np.ndarray] | None, sizes: np.ndarray) -> list[dict] | None:
    """COCO compressed RLEs of uncompressed run lengths, made by the package's own mask module."""
    if runs is None:
        return None
    if not runs:
        return []
    objects = [{"size": size, "counts": counts.tolist()} for size, counts in zip(sizes.tolist(), runs)]
    return mask.frPyObjects(objects, *objects[0]["size"])
