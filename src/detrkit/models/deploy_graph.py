"""The detector and its post-processing as one module with plain tensor outputs: what predict() runs and export writes.

The graph's outputs stay in normalised image coordinates, so one graph serves every source
image size; `to_pixel_results` scales them on the host. Named outputs, in order:

- boxes  (B, K, 4) float32, xyxy in [0, 1] of the network input's width and height
- scores (B, K) float32, descending; labels (B, K) int64 (class index)
- masks  (B, K, h, w) float32 mask logits at a quarter of the input size (segmentation models)
- keypoints (B, K, W, 3) float32 as normalised x, y and σ(findable), and
  keypoint_precision_cholesky (B, K, W, 3) (keypoint models; NaN on a class's unused slots)
- pred_logits (B, Q, C) and pred_boxes (B, Q, 4) cxcywh: the class and box heads' raw outputs

K = min(num_select, queries × classes). With `raw=True` the outputs are the heads' own:
pred_logits, pred_boxes, pred_masks (B, Q, h, w), pred_keypoints (B, Q, C'·W, 8).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from detrkit.models.detector import Detector
from detrkit.models.postprocess import select_detections_batched, unbatch

# raw outputs that post-processed graphs carry too (small beside masks), for the export check
RAW_EXTRAS = ("pred_logits", "pred_boxes")
_OPTIONAL = (("masks", "pred_masks", "segmentation_head"), ("keypoints", "pred_keypoints", "keypoint_embed"))


def output_names(detector: Detector, raw: bool = False) -> list[str]:
    """The names of a DeployGraph's outputs, in order, for this detector's heads."""
    names = ["pred_logits", "pred_boxes"] if raw else ["boxes", "scores", "labels"]
    for processed, head_output, head in _OPTIONAL:
        if getattr(detector, head) is not None:
            names.append(head_output if raw else processed)
            if processed == "keypoints" and not raw:
                names.append("keypoint_precision_cholesky")
    return names if raw else [*names, *RAW_EXTRAS]


class DeployGraph(nn.Module):
    """detector (in eval) -> post-processed top-K detections of each image, as a tuple of tensors
    in `output_names` order."""

    def __init__(self, detector: Detector, num_select: int, num_keypoints_per_class: Sequence[int] = (),
                 trace_alpha: float = 0.0, raw: bool = False) -> None:
        super().__init__()
        self.detector = detector
        self.num_select = num_select
        self.num_keypoints_per_class = tuple(num_keypoints_per_class)
        self.trace_alpha = trace_alpha
        self.raw = raw
        self.names = output_names(detector, raw)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """pixels (B, C, H, W) float32, normalised as BatchPreparer does."""
        outputs = self.detector(pixels)
        if self.raw:
            return tuple(outputs[name].float() for name in self.names)
        unit = torch.ones(pixels.shape[0], 2, dtype=torch.float32, device=pixels.device)
        results = select_detections_batched(outputs, unit, self.num_select, self.num_keypoints_per_class,
                                            self.trace_alpha)
        results |= {name: outputs[name] for name in RAW_EXTRAS}
        return tuple(results[name] if name == "labels" else results[name].float() for name in self.names)


def to_pixel_results(outputs: dict[str, torch.Tensor], sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per image, the post-processed outputs with boxes and keypoints in that image's pixels.

    outputs: DeployGraph's outputs by name (batch-first); sizes (B, 2) as (H, W). The boxes are
    scaled by (W, H, W, H) (the graph clamped them to [0, 1]), keypoint x, y by (W, H); scores,
    labels, mask logits and precisions pass through; the raw extras are left out. The same numbers as select_detections with
    the image sizes, since clamping to [0, 1] then scaling equals scaling then clamping to the size.
    """
    height, width = sizes.to(torch.float32).unbind(-1)
    scale = torch.stack((width, height, width, height), -1)[:, None]  # (B, 1, 4)
    scaled = {name: value for name, value in outputs.items() if name not in RAW_EXTRAS}
    scaled["boxes"] = outputs["boxes"] * scale
    if "keypoints" in outputs:
        points = outputs["keypoints"]
        xy = points[..., :2] * scale[:, :, None, :2]  # (B, K, W, 2)
        scaled["keypoints"] = torch.cat((xy, points[..., 2:]), -1)
    return unbatch(scaled)
