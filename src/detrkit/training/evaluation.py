"""Collect an epoch's detections on the device and score them once: COCO mAP/mAR and best F1."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from detrkit.datasets.transforms import resize_masks
from detrkit.models.postprocess import masks_at_size, positive_windows, valid_mask_region
from detrkit.structures import Target
from detrkit.training.coco_backends.rle import EncodedMasks
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.confidence_sweep import sweep_confidence


# torchmetrics keys of COCOeval's twelve summary numbers, in its order, less mar_<max dets> (the 9th)
_COCO_STATS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10",
               "mar_small", "mar_medium", "mar_large")
# logged keypoint name -> the metric's OKS key (COCO keypoint AP and AR at 20 detections per image)
KEYPOINT_METRICS = {"keypoint_map_50_95": "keypoints_map", "keypoint_map_50": "keypoints_map_50",
                    "keypoint_map_75": "keypoints_map_75", "keypoint_mAR": "keypoints_mar_20"}


class DetectionEvaluator:
    """Accumulates per-image detections and ground truth without host syncs; `compute()` moves
    everything to the CPU once and returns metric name -> value.

    With `class_names` (label i is named class_names[i]), `compute()` adds `AP/<name>`, the
    COCO AP of each class that has ground truth (crowd regions aside). Classes seen only among
    the detections have no AP (the metric's -1) and are left out, so the keys depend only on
    the ground truth and stay the same from epoch to epoch.

    `masks` adds mask AP (`segm_*`) from detections' and ground truth's "masks" (see with_masks);
    `keypoints` adds OKS keypoint AP and AR (KEYPOINT_METRICS' names, each left out while it is
    -1, i.e. no keypoint ground truth) from their "keypoints" (see with_keypoints), scored with
    `keypoint_sigmas` (default: COCO person's for 17 keypoints, else 0.05 each).
    """

    def __init__(self, max_dets: int, backend: str = "vernier", class_names: list[str] | None = None,
                 masks: bool = False, keypoints: bool = False,
                 keypoint_sigmas: Sequence[float] | None = None) -> None:
        if masks and keypoints:
            raise ValueError("an evaluation scores masks or keypoints, not both")
        self.max_dets, self.backend, self.masks, self.keypoints = max_dets, backend, masks, keypoints
        self.keypoint_sigmas = None if keypoint_sigmas is None else list(keypoint_sigmas)
        self.class_names = None if class_names is None else list(class_names)
        self._detections: list[dict[str, torch.Tensor]] = []
        self._truth: list[dict[str, torch.Tensor]] = []
        self.coco_stats: list[float] = []  # COCOeval's twelve summary numbers, set by compute()

    def add(self, detections: list[dict[str, torch.Tensor]], truth: list[dict[str, torch.Tensor]]) -> None:
        self._detections += [{k: v.detach() for k, v in d.items()} for d in detections]
        self._truth += [{k: v.detach() for k, v in t.items()} for t in truth]

    def __len__(self) -> int:
        return len(self._detections)

    @property
    def detections(self) -> list[dict[str, torch.Tensor]]:
        """Every image's detections so far, on the CPU (torchmetrics-style dicts, pixels xyxy)."""
        return [{k: v.cpu() for k, v in d.items()} for d in self._detections]

    @property
    def truth(self) -> list[dict[str, torch.Tensor]]:
        """Every image's ground truth so far, on the CPU, as `detections` is scored against it."""
        return [{k: v.cpu() for k, v in t.items()} for t in self._truth]

    def gather(self) -> None:
        """Take in every process's images (distributed runs), in the data set's order: process r
        of W scored images r, r + W, r + 2W, ... (see RFDETRDataModule), so interleaving their
        lists restores the order a single process sees. Every process must call this."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        mine = [[{k: v.cpu() for k, v in d.items()} for d in self._detections],
                [{k: v.cpu() for k, v in t.items()} for t in self._truth]]
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        longest = max(len(detections) for detections, _ in parts)
        order = [(rank, j) for j in range(longest) for rank in range(len(parts)) if j < len(parts[rank][0])]
        self._detections = [parts[rank][0][j] for rank, j in order]
        self._truth = [parts[rank][1][j] for rank, j in order]

    def compute(self) -> dict[str, float]:
        detections = [{k: v.cpu() for k, v in d.items()} for d in self._detections]
        truth = [{k: v.cpu() for k, v in t.items()} for t in self._truth]
        iou_type = ("bbox", "segm") if self.masks else ("bbox", "keypoints") if self.keypoints else "bbox"
        metric = OnePassCocoMeanAveragePrecision(iou_type=iou_type, backend=self.backend,
                                                 max_detection_thresholds=[1, 10, self.max_dets],
                                                 class_metrics=self.class_names is not None,
                                                 oks_sigmas=self.keypoint_sigmas,
                                                 sync_on_compute=False)  # gather() did that
        metric.update(detections, truth)
        result = metric.compute()
        box = {key.removeprefix("bbox_"): value for key, value in result.items()
               if not key.startswith(("segm_", "keypoints_"))}
        self.coco_stats = [float(box[key]) for key in _COCO_STATS[:8]] + [
            float(box[f"mar_{self.max_dets}"])] + [float(box[key]) for key in _COCO_STATS[8:]]
        sweep = sweep_confidence([{k: d[k] for k in ("boxes", "scores", "labels")} for d in detections], truth)
        values = {"mAP_50_95": float(box["map"]), "mAP_50": float(box["map_50"]),
                  "mAP_75": float(box["map_75"]), "mAR": float(box[f"mar_{self.max_dets}"]),
                  "precision": sweep.best_precision, "recall": sweep.best_recall, "F1": sweep.best_f1}
        if self.masks:
            values |= {"segm_mAP_50_95": float(result["segm_map"]), "segm_mAP_50": float(result["segm_map_50"]),
                       "segm_mAP_75": float(result["segm_map_75"]),
                       "segm_mAR": float(result[f"segm_mar_{self.max_dets}"])}
        if self.keypoints:  # as rfdetr logs them: an unavailable (-1) value is not logged
            values |= {name: float(result[key]) for name, key in KEYPOINT_METRICS.items() if result[key] >= 0}
        if self.class_names is not None:
            values |= self._per_class(box["classes"].tolist(), box["map_per_class"].reshape(-1).tolist())
        return values

    def _per_class(self, classes: list[int], average_precision: list[float]) -> dict[str, float]:
        """`AP/<name>` of each class with ground truth (AP -1 marks the others)."""
        values = {}
        for label, value in zip(classes, average_precision):
            if value == -1.0:
                continue
            if not 0 <= label < len(self.class_names):
                raise ValueError(f"ground truth label {label} has no name among the {len(self.class_names)} "
                                 f"class_names {self.class_names}")
            values[f"AP/{self.class_names[label]}"] = value
        return values


def with_masks(detections: list[dict[str, torch.Tensor]], truth: list[dict[str, torch.Tensor]],
               targets: list[Target], padded_size: tuple[int, int], head_resolution: bool) -> None:
    """Give each image's detections (whose "masks" are the selected queries' (K, h, w) logits)
    and ground truth run-length encoded masks of one size: the source image's, or with
    `head_resolution` the mask head's (cheaper, areas in head pixels). Ground-truth masks are
    resized from the transformed image (nearest), crowd regions get their boxes filled."""
    for detection, image_truth, target in zip(detections, truth, targets):
        logits = detection["masks"]
        valid = valid_mask_region(tuple(logits.shape[-2:]), padded_size, target.size)
        size = valid if head_resolution else target.orig_size
        # on the CPU, encoding reads only where a mask can be set (per-mask work a GPU need not do)
        windows = positive_windows(logits[:, :valid[0], :valid[1]], size) if logits.device.type == "cpu" else None
        detection["masks"] = EncodedMasks.encode(masks_at_size(logits, valid, size), windows)
        objects = resize_masks(target.masks, size)  # (N, H, W)
        crowds = _filled_boxes(image_truth["boxes"][len(objects):], target.orig_size, size)
        image_truth["masks"] = EncodedMasks.encode(torch.cat([objects, crowds]))


def with_keypoints(truth: list[dict[str, torch.Tensor]], targets: list[Target]) -> None:
    """Give each image's ground truth (as _pixel_boxes builds it: objects, then crowd regions)
    its "keypoints" (N + M, K, 3): x, y in source-image pixels and the visibility 0..2, and
    none labelled (zeros) on crowd regions, which COCOeval then ignores."""
    for image_truth, target in zip(truth, targets):
        height, width = target.orig_size
        keypoints = target.keypoints * target.keypoints.new_tensor([width, height, 1.0])  # (N, K, 3)
        crowds = len(image_truth["labels"]) - len(keypoints)
        image_truth["keypoints"] = torch.cat([keypoints, keypoints.new_zeros((crowds, *keypoints.shape[1:]))])


def _filled_boxes(boxes: torch.Tensor, box_frame: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(M, H, W) masks of xyxy boxes given in a `box_frame` (H, W) image, drawn at `size`."""
    scale = boxes.new_tensor([size[1] / box_frame[1], size[0] / box_frame[0]] * 2)
    x0, y0, x1, y1 = (boxes * scale).round().long().unbind(-1)
    rows = torch.arange(size[0], device=boxes.device)[None, :, None]
    columns = torch.arange(size[1], device=boxes.device)[None, None, :]
    return ((rows >= y0[:, None, None]) & (rows < y1[:, None, None])
            & (columns >= x0[:, None, None]) & (columns < x1[:, None, None]))
