#!/usr/bin/env python3
"""Learning experiments: benchmarks/train_epoch.py with one named change applied first.

    python benchmarks/learning_arms.py ARM [train_epoch.py arguments]

Arms:
  reference-transform  detrkit trains on samples made by the reference package's own default
                       torchvision training transform (resize branches, flip, normalise), called on
                       the same decoded images; needs `rfdetr` importable. Set beside the
                       reference run with augmentation_backend="torchvision", it tells a difference
                       in the per-sample pipeline from one in the model, losses or loop.
  baseline             no change (the same process set-up, for a fair side-by-side).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors


class ReferenceTransform:
    """(uint8 tv Image, {boxes xyxy px, labels, area}) -> the reference's (normalised image, same keys)."""

    def __init__(self, scales: list[int], scale_jitter: bool) -> None:
        from rfdetr.datasets.coco import _route_transforms

        self.transform = _route_transforms("train", max(scales), list(scales), square=True, aug_config=None,
                                           scale_jitter=scale_jitter, gpu_postprocess=False, keypoint_flip_pairs=None)

    def __call__(self, image: tv_tensors.Image, sample: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        height, width = image.shape[-2:]
        picture = Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy()))
        count = len(sample["labels"])
        target = {"boxes": sample["boxes"].as_subclass(torch.Tensor).float(), "labels": sample["labels"],
                  "area": sample["area"].float(), "iscrowd": torch.zeros(count, dtype=torch.int64),
                  "image_id": torch.tensor(0), "orig_size": torch.tensor([height, width]),
                  "size": torch.tensor([height, width])}
        pixels, target = self.transform(picture, target)
        out_h, out_w = pixels.shape[-2:]
        cx, cy, w, h = (target["boxes"] * torch.tensor([out_w, out_h, out_w, out_h])).unbind(-1)
        boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), -1)
        return pixels, {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(out_h, out_w)),
                        "labels": target["labels"], "area": target["area"]}


def apply(arm: str) -> None:
    if arm == "baseline":
        return
    if arm == "reference-transform":
        from detrkit.datasets.augmentation import TorchvisionAugmentation

        TorchvisionAugmentation.train_transform = (
            lambda self, scales, square, scale_jitter: ReferenceTransform(list(scales), scale_jitter))
        return
    raise SystemExit(f"unknown arm {arm!r}; see --help")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0)
    apply(sys.argv.pop(1))
    script = Path(__file__).with_name("train_epoch.py")
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
