#!/usr/bin/env python3
"""Learning experiments: benchmarks/train_epoch.py with one named change applied first.

    python benchmarks/learning_arms.py ARM [train_epoch.py arguments]

Arms:
  reference-transform  detrkit trains on samples made by the reference package's own default
                       torchvision training transform (resize branches, flip, normalise), called on
                       the same decoded images; needs `rfdetr` importable. Set beside the
                       reference run with augmentation_backend="torchvision", it tells a difference
                       in the per-sample pipeline from one in the model, losses or loop.
  reference-albumentations  as reference-transform, with the reference's default Albumentations
                       pipeline (what it trains on when albumentations is installed) instead; detrkit's
                       loader, sampler and per-sample seeding stay. Beside reference-loader it tells the
                       per-sample transform from the rest of the loader.
  private-draws        detrkit's own default per-sample transform, its random draws taken from one
                       process-wide stream instead of the seeded per-sample ones (the loader still
                       seeds them; the transform reseeds torch's generator from its own stream first).
                       Beside reference-albumentations, whose Albumentations draws come from its own
                       stream too, it tells the random draws from the transform's operations.
  reference-loader     detrkit's model, losses and loop train on the reference's own training
                       DataLoader (its data set, transforms, sampler and collate; detrkit's
                       per-batch multi-scale resize still applies); needs `rfdetr` importable.
                       Beside the plain reference run it tells the data pipeline as a whole
                       from everything after it.
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

    def __init__(self, scales: list[int], scale_jitter: bool, aug_config: dict | None = None) -> None:
        from rfdetr.datasets.coco import _route_transforms

        self.transform = _route_transforms("train", max(scales), list(scales), square=True, aug_config=aug_config,
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


class ReferenceBatches:
    """The reference's training DataLoader, its batches turned into detrkit Batches."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        from detrkit.structures import Batch, Target

        for samples, targets in self.loader:
            padding = samples.mask if samples.mask is not None and bool(samples.mask.any()) else None
            yield Batch(samples.tensors, padding, [
                Target(boxes=t["boxes"], labels=t["labels"], image_id=int(t["image_id"]),
                       orig_size=tuple(int(v) for v in t["orig_size"]), size=tuple(int(v) for v in t["size"]),
                       area=t.get("area")) for t in targets])


def reference_train_loader(datamodule) -> ReferenceBatches:
    """Build the reference's data module from the same settings and return its training loader."""
    from rfdetr.config import RFDETRNanoConfig, TrainConfig
    from rfdetr.training.module_data import RFDETRDataModule

    ours = datamodule.train_config
    model_config = RFDETRNanoConfig(pretrain_weights=None, resolution=datamodule.model_config.resolution,
                                    num_classes=len(datamodule.class_names))
    train_config = TrainConfig(dataset_dir=ours.dataset_dir, output_dir=ours.output_dir, batch_size=ours.batch_size,
                               num_workers=ours.num_workers, seed=ours.seed, multi_scale=ours.multi_scale != "off",
                               expanded_scales=ours.expanded_scales, epochs=ours.epochs)
    reference = RFDETRDataModule(model_config, train_config)
    reference.setup("fit")
    return ReferenceBatches(reference.train_dataloader())


def patch_train_transform(make) -> None:
    """detrkit's training samples made by make(detrkit's own transform, scales, scale_jitter)."""
    from detrkit.datasets.augmentation import TorchvisionAugmentation

    original = TorchvisionAugmentation.train_transform

    def train_transform(self, scales, square, scale_jitter, keypoint_flip=None):
        return make(original(self, scales, square, scale_jitter, keypoint_flip), list(scales), scale_jitter)

    TorchvisionAugmentation.train_transform = train_transform


def use_reference_transform() -> None:
    patch_train_transform(lambda _, scales, scale_jitter: ReferenceTransform(scales, scale_jitter))


def use_reference_albumentations() -> None:
    from rfdetr.datasets.aug_configs import AUG_CONFIG

    patch_train_transform(lambda _, scales, scale_jitter: ReferenceTransform(scales, scale_jitter, AUG_CONFIG))


class PrivateDraws:
    """A per-sample transform whose torch draws come from a stream of its own, not the seeded globals."""

    def __init__(self, transform) -> None:
        import random

        self.transform, self.stream = transform, random.Random()

    def __call__(self, image, sample):
        torch.manual_seed(self.stream.getrandbits(62))  # the loader's fork_rng restores the global state
        return self.transform(image, sample)


def use_private_draws() -> None:
    patch_train_transform(lambda ours, scales, scale_jitter: PrivateDraws(ours))


def use_reference_loader() -> None:
    from detrkit.training.datamodule import RFDETRDataModule

    RFDETRDataModule.train_dataloader = reference_train_loader


ARMS = {"baseline": lambda: None, "reference-transform": use_reference_transform,
        "reference-albumentations": use_reference_albumentations, "reference-loader": use_reference_loader,
        "private-draws": use_private_draws}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0)
    arm = sys.argv.pop(1)
    if arm not in ARMS:
        raise SystemExit(f"unknown arm {arm!r}: one of {', '.join(ARMS)}")
    ARMS[arm]()
    script = Path(__file__).with_name("train_epoch.py")
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
