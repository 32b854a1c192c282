"""The hotcoco backend: a Rust COCOeval fed with columns instead of a dict per annotation (boxes, masks)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from detrkit.training.coco_backends.base import CocoInputs
from detrkit.training.coco_backends.cocoapi import PackageCocoBackend, coco_dataset, compressed_rles


class HotcocoBackend(PackageCocoBackend):
    package = "hotcoco"
    distribution = "hotcoco"

    def _package(self) -> tuple[type, type, ModuleType]:
        package = self.module
        return package.COCO, package.COCOeval, package.mask

    def _ground_truth(self, inputs: CocoInputs) -> Any:
        coco, _, mask = self._package()
        if inputs.iou_type == "keypoints":  # from_arrays has no keypoint columns
            return coco(coco_dataset(inputs, None))
        images = [
            {"id": image_id, "height": height, "width": width}
            for image_id, (height, width) in zip(inputs.image_ids.tolist(), inputs.image_sizes.tolist())
        ]
        categories = [{"id": category, "name": str(category)} for category in inputs.category_ids.tolist()]
        return coco.from_arrays(
            images,
            categories,
            inputs.gt_image_ids,
            inputs.gt_category_ids,
            inputs.gt_boxes,
            ids=inputs.gt_ids,
            area=inputs.gt_areas,
            iscrowd=inputs.gt_crowd,
            segmentation=compressed_rles(mask, inputs.gt_rles, inputs.gt_sizes()),
        )

    def _detections(self, gt: Any, inputs: CocoInputs) -> Any:
        if inputs.iou_type == "bbox":
            return gt.load_res(inputs.detection_matrix())
        if inputs.iou_type == "keypoints":
            return gt.load_res(inputs.keypoint_results())
        _, _, mask = self._package()
        rles = compressed_rles(mask, inputs.dt_rles, inputs.dt_sizes())
        detections = gt.load_res(inputs.detection_matrix(), segmentation=rles)
        # rows carry a box, so load_res took its area; a segm result is bucketed by its mask's
        ids = np.arange(1, len(rles) + 1, dtype=np.int64)
        detections.update_anns(ids=ids, area=np.asarray(mask.area(rles), dtype=np.float64))
        return detections
