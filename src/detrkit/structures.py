"""Typed containers passed between packages; model outputs also read as mappings."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class MaskFactors:
    """Mask logits kept factored, as segmentation models emit them while training: the logit of
    query q at (y, x) is spatial[b, :, y, x] . queries[b, q, :] + bias, so losses can evaluate
    only matched queries at sampled points instead of every query at every pixel."""

    spatial: torch.Tensor  # (B, D, h, w) projected pixel features
    queries: torch.Tensor  # (B, Q, D) projected query features
    bias: torch.Tensor  # (1,)

    def dense(self) -> torch.Tensor:
        """(B, Q, h, w) logits of every query at every pixel."""
        return torch.einsum("bdhw,bqd->bqhw", self.spatial, self.queries) + self.bias


@dataclass
class DetectorOutput(Mapping):
    """Predictions of one output layer; `out.pred_logits` and `out["pred_logits"]` both work.

    pred_logits (B, Q, C) raw class logits, C = num_classes + 1; pred_boxes (B, Q, 4)
    normalised cxcywh. The final layer also carries the auxiliary decoder layers (first to
    second-to-last) and the two-stage encoder proposals. Segmentation models add pred_masks:
    (B, Q, H/r, W/r) logits in eval, MaskFactors while training. Keypoint models add
    pred_keypoints (B, Q, K, 8): per keypoint slot x, y (normalised), findable and visible
    logits, log l11, l21, log l22 (precision Cholesky factor) and the class-logit contribution;
    K = keypoint classes x their most keypoints. Absent (None) entries are not keys.
    """

    pred_logits: torch.Tensor
    pred_boxes: torch.Tensor
    aux_outputs: list[DetectorOutput] | None = None
    enc_outputs: DetectorOutput | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # other optional heads
    pred_masks: torch.Tensor | MaskFactors | None = None
    pred_keypoints: torch.Tensor | None = None

    def _items(self) -> dict[str, Any]:
        present = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extras"}
        present.update(self.extras)
        return {k: v for k, v in present.items() if v is not None}

    def __getitem__(self, key: str) -> Any:
        items = self._items()
        if key not in items:
            raise KeyError(f"{key!r} is not among the model outputs {sorted(items)}")
        return items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


@dataclass
class Target:
    """Ground truth of one image after transforms.

    boxes (N, 4) normalised cxcywh relative to the transformed, unpadded image; labels (N,)
    int64 class indices; area (N,) box or segment area in source-image pixels (COCO's area
    ranges use it); image_id the dataset's id; orig_size and size (H, W) of the source and
    transformed image. Crowd regions (COCO iscrowd=1) are kept apart from the boxes, which
    losses train on, for evaluation to ignore detections on them: crowd_boxes (M, 4) xyxy in
    source-image pixels, so no transform or resize touches them; crowd_labels (M,) int64.
    Segmentation data adds masks (N, h, w) bool, one per box, at the transformed image's size;
    keypoint data adds keypoints (N, K, 3) float: x, y normalised to the transformed image and
    the visibility v (0 unlabeled, 1 occluded, 2 visible).
    """

    boxes: torch.Tensor
    labels: torch.Tensor
    image_id: int
    orig_size: tuple[int, int]
    size: tuple[int, int]
    area: torch.Tensor | None = None
    crowd_boxes: torch.Tensor | None = None
    crowd_labels: torch.Tensor | None = None
    masks: torch.Tensor | None = None
    keypoints: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Target:
        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device, non_blocking=True)

        return Target(move(self.boxes), move(self.labels), self.image_id, self.orig_size, self.size,
                      move(self.area), move(self.crowd_boxes), move(self.crowd_labels), move(self.masks),
                      move(self.keypoints))


@dataclass
class Batch:
    """Images padded to one size: pixels (B, C, H, W) normalised; padding (B, H, W) True on
    padded pixels, or None when no image needed padding."""

    pixels: torch.Tensor
    padding: torch.Tensor | None
    targets: list[Target]

    def to(self, device: torch.device | str) -> Batch:
        padding = None if self.padding is None else self.padding.to(device, non_blocking=True)
        return Batch(self.pixels.to(device, non_blocking=True), padding, [t.to(device) for t in self.targets])

    def __len__(self) -> int:
        return len(self.targets)
