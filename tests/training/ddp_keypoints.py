"""Run by tests/training/test_keypoint_training.py: train a tiny keypoint model on CPU with one or
more processes (gloo, Lightning's launcher). Each process writes `weights<r>.pt` (its final
detector weights) and `syncs<r>.json` (how many backward passes reduced gradients across processes,
counted by a DDP communication hook) into the output folder.

    python ddp_keypoints.py DATA OUTPUT --devices N --batch-size B --accumulation K
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_config.TINY

from tiny_config import TINY  # noqa: E402

from detrkit import RFDETRKeypointPreview  # noqa: E402
from detrkit.datasets.synthetic import make_synthetic_dataset  # noqa: E402

# TINY with GroupPose keypoints: the synthetic shapes' three classes, four corners each
KEYPOINT_MODEL = {**TINY, "patch_size": 16, "num_keypoints_per_class": [4, 4, 4]}
# plain SGD and no clipping, so that a gradient of another scale shows in the weights (AdamW and
# clipping would hide it); no EMA, so that the final weights are the trained ones
# The torchvision recipe: with the default one, the first step's two-stage top-k meets a near tie
# (k-th and next encoder score 2.1e-6 apart), so float noise alone (batch 1 against batch 4, or 1
# thread against 2) swaps one selected proposal and the weights end 1.5e-4 apart; with these
# images the closest call is 2.9e-5 apart, beyond the noise.
EXACT = dict(epochs=1, optimizer="sgd", lr=2e-3, lr_encoder=2e-3, clip_max_norm=0, use_ema=False, num_workers=0,
             progress_bar=None, tensorboard=False, seed=0, eval_batch_size=2, augmentation_backend="torchvision")


def keypoint_model() -> RFDETRKeypointPreview:
    torch.manual_seed(0)  # the same initial weights for every run that is compared
    return RFDETRKeypointPreview(**KEYPOINT_MODEL)


def keypoint_data(root: Path) -> Path:
    """Six training images of shapes with corner keypoints; image 1 has no boxes, image 0 has
    boxes whose keypoints are all unlabelled (v = 0)."""
    root = make_synthetic_dataset(root, num_train=6, num_valid=2, image_size=(64, 64), max_objects=3, seed=0,
                                  keypoints=True)
    annotations = root / "train" / "_annotations.coco.json"
    data = json.loads(annotations.read_text())
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] != 1]
    for annotation in data["annotations"]:
        if annotation["image_id"] == 0:
            annotation.update(keypoints=[0] * len(annotation["keypoints"]), num_keypoints=0)
    annotations.write_text(json.dumps(data))
    return root


class CountSyncs(pl.Callback):
    """Counts the backward passes that all-reduce gradients: DDP calls its communication hook once
    per bucket of each synchronised backward, bucket 0 once."""

    def __init__(self) -> None:
        self.syncs = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        network = trainer.strategy.model
        if isinstance(network, DistributedDataParallel):
            network.register_comm_hook(None, self.hook)

    def hook(self, state, bucket):
        self.syncs += bucket.index() == 0
        return default_hooks.allreduce_hook(state, bucket)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("output", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--accumulation", type=int, default=1)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    args.output.mkdir(parents=True, exist_ok=True)
    counter = CountSyncs()
    model = keypoint_model()
    model.train(dataset_dir=args.data, output_dir=str(args.output), batch_size=args.batch_size,
                grad_accum_steps=args.accumulation, devices=args.devices, accelerator="cpu",
                strategy="auto" if args.devices == 1 else "ddp", callbacks=[counter], **EXACT)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.save(model.model.state_dict(), args.output / f"weights{rank}.pt")
    (args.output / f"syncs{rank}.json").write_text(json.dumps({"syncs": counter.syncs}))


if __name__ == "__main__":
    main()
