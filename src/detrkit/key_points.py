"""supervision `KeyPoints` from a keypoint model's kept detections, laid out as rfdetr's predict returns them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import supervision as sv


def as_key_points(detections: sv.Detections, kept: dict[str, torch.Tensor], covariance: torch.Tensor,
                  source_image: np.ndarray | None = None) -> sv.KeyPoints:
    """One image's keypoint predictions: N detections of K keypoints each.

    `detections` are the kept boxes (with data "class_name" and "source_shape"), `kept` the
    postprocessed tensors of the same rows: "keypoints" (N, K, 3) as x, y in source pixels and
    σ(findable), "keypoint_precision_cholesky" (N, K, 3); `covariance` (N, K, 2, 2) in pixels.
    The result has xy (N, K, 2) float32, keypoint_confidence (N, K) float32 (σ(findable); 0 on a
    class's unused slots, which are not `visible`), detection_confidence (N,) float32 (the
    threshold's score), class_id (N,) int; its data holds the detections' data plus "xyxy"
    (N, 4) float32 boxes, "keypoint_precision_cholesky" (N, K, 3), "covariance" (N, K, 2, 2)
    float32 (NaN where undefined) and, with a source image, "source_image" (one per row:
    KeyPoints has no collection-level metadata). Shapes and dtypes hold for N = 0.
    """
    import supervision as sv  # heavy import, deferred so that `import detrkit` stays fast

    points = kept["keypoints"].float().cpu().numpy()  # (N, K, 3)
    confidence = np.ascontiguousarray(points[..., 2])
    data = dict(detections.data)
    data["xyxy"] = detections.xyxy.astype(np.float32)
    data["keypoint_precision_cholesky"] = kept["keypoint_precision_cholesky"].float().cpu().numpy()
    data["covariance"] = covariance.float().cpu().numpy()
    if source_image is not None:
        data["source_image"] = [source_image] * len(detections)
    return sv.KeyPoints(xy=np.ascontiguousarray(points[..., :2]), keypoint_confidence=confidence,
                        detection_confidence=detections.confidence.astype(np.float32),
                        class_id=detections.class_id.astype(int), visible=confidence > 0, data=data)
