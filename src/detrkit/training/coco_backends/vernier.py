"""The vernier backend: array-native ground truth and detections, evaluated on a Rust grid.

Runs in vernier's "strict" parity mode, whose arrays are pycocotools' own bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from detrkit.training.coco_backends.base import Accumulation, CocoBackend, CocoInputs, EvalGrid


class VernierBackend(CocoBackend):
    package = "vernier"
    distribution = "vernier"
    requires_bbox = True  # vernier's mask detections carry a box

    def accumulate(self, inputs: CocoInputs, grid: EvalGrid) -> Accumulation:
        instance = self.module.instance
        options: dict[str, Any] = {}
        if inputs.iou_type == "bbox":
            evaluate, detections = instance.evaluate_bbox_grid, inputs.detection_matrix()
        elif inputs.iou_type == "segm":
            evaluate, detections = instance.evaluate_segm_grid, _mask_detections(inputs, inputs.dt_rles)
        else:
            evaluate, detections = instance.evaluate_keypoints_grid, _keypoint_detections(inputs)
            options["sigmas"] = {category: inputs.keypoint_sigmas.tolist() for category in inputs.category_ids.tolist()}
        evaluated = evaluate(
            self._ground_truth(inputs),
            detections,
            parity_mode="strict",  # pycocotools bit for bit; "corrected" changes upstream quirks
            max_dets_per_image=max(grid.max_dets),
            use_cats=True,
            iou_thresholds=list(grid.iou_thresholds),
            recall_thresholds=list(grid.recall_thresholds),
            dt_area="mask" if inputs.iou_type == "segm" else "bbox",  # keypoints: their extent's box
            **options,
        )
        result = evaluated.accumulate(list(grid.max_dets))
        return Accumulation(np.asarray(result.precision, np.float64), np.asarray(result.recall, np.float64))

    def _ground_truth(self, inputs: CocoInputs) -> Any:
        images = {
            "id": inputs.image_ids,
            "height": np.ascontiguousarray(inputs.image_sizes[:, 0]),
            "width": np.ascontiguousarray(inputs.image_sizes[:, 1]),
        }
        annotations = {
            "id": inputs.gt_ids,
            "image_id": inputs.gt_image_ids,
            "category_id": inputs.gt_category_ids,
            "bbox": np.ascontiguousarray(inputs.gt_boxes),
            "area": inputs.gt_areas,
            "iscrowd": inputs.gt_crowd,
        }
        if inputs.gt_rles is not None:
            annotations["segmentation"] = _rles(inputs.gt_rles, inputs.gt_sizes())
        if inputs.gt_keypoints is not None:
            annotations["keypoints"] = np.ascontiguousarray(inputs.gt_keypoints)
            annotations["num_keypoints"] = inputs.gt_num_keypoints()
        categories = [{"id": category, "name": str(category)} for category in inputs.category_ids.tolist()]
        return self.module.instance.CocoDataset.from_arrays(images, annotations, categories)


def _rles(runs: list[np.ndarray], sizes: np.ndarray) -> list[dict]:
    """vernier's uncompressed RLE form: uint32 counts and (height, width)."""
    return [{"counts": counts, "size": (height, width)} for counts, (height, width) in zip(runs, sizes.tolist())]


def _image_spans(inputs: CocoInputs) -> list[tuple[int, int]]:
    """(start, end) of each image's detections, which are stored image by image."""
    starts = np.flatnonzero(np.r_[True, inputs.dt_image_ids[1:] != inputs.dt_image_ids[:-1]])
    ends = np.r_[starts[1:], len(inputs.dt_image_ids)]
    return list(zip(starts.tolist(), ends.tolist()))


def _keypoint_detections(inputs: CocoInputs) -> list[dict]:
    """One array-form keypoint batch per image that has detections, boxed by their keypoints' extent."""
    boxes = inputs.dt_keypoint_boxes()
    return [
        {
            "image_id": int(inputs.dt_image_ids[start]),
            "boxes": np.ascontiguousarray(boxes[start:end]),
            "scores": np.ascontiguousarray(inputs.dt_scores[start:end]),
            "labels": np.ascontiguousarray(inputs.dt_category_ids[start:end]),
            "keypoints": np.ascontiguousarray(inputs.dt_keypoints[start:end]),
        }
        for start, end in _image_spans(inputs)
    ]


def _mask_detections(inputs: CocoInputs, runs: list[np.ndarray]) -> list[dict]:
    """One array-form detection batch per image that has detections, in the given order."""
    rles = _rles(runs, inputs.dt_sizes())
    return [
        {
            "image_id": int(inputs.dt_image_ids[start]),
            "boxes": np.ascontiguousarray(inputs.dt_boxes[start:end]),
            "scores": np.ascontiguousarray(inputs.dt_scores[start:end]),
            "labels": np.ascontiguousarray(inputs.dt_category_ids[start:end]),
            "rles": rles[start:end],
        }
        for start, end in _image_spans(inputs)
    ]
