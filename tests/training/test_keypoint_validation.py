"""Keypoint models through validation: OKS metrics logged, weights ranked by keypoint AP, and
fine-tuning from given weights starts every keypoint at unit precision."""

from __future__ import annotations

import csv
import math

import torch
from tiny_config import TINY

from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.variants import RFDETRKeypointPreview

KEYPOINTS = dict(use_grouppose_keypoints=True, dual_projector=True, dual_projector_kp_only=True,
                 num_keypoints_per_class=[4, 4, 4], patch_size=16, num_windows=2)
FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0, skip_best_epochs=0)


def tiny_pose(**changes) -> RFDETRKeypointPreview:
    torch.manual_seed(0)
    kwargs = {key: value for key, value in TINY.items() if key != "num_classes"}
    return RFDETRKeypointPreview(**{**kwargs, **KEYPOINTS, **changes})


def precision_rows(model: RFDETRKeypointPreview) -> torch.Tensor:
    last = model.model.keypoint_embed.layers[-1]
    return last.weight.view(-1, 8, last.weight.shape[-1])[:, 4:7]


def test_keypoint_models_log_oks_metrics_and_rank_by_keypoint_ap(tmp_path):
    data = make_synthetic_dataset(tmp_path / "data", num_train=4, num_valid=2, image_size=(64, 64), seed=0,
                                  keypoints=True)
    torch.manual_seed(1)
    source = tiny_pose()
    with torch.no_grad():
        for param in source.model.keypoint_embed.parameters():
            param.add_(torch.randn_like(param))
    weights = tmp_path / "pose.pth"
    torch.save({"model": source.model.state_dict(), "args": {"num_classes": source.model.num_classes}}, weights)
    model = tiny_pose(pretrain_weights=str(weights))
    assert precision_rows(model).abs().sum() > 0

    seen = {}

    import pytorch_lightning as pl

    class AtStart(pl.Callback):
        def on_train_start(self, trainer, module):
            seen["precision"] = precision_rows(model).clone()

    model.train(dataset_dir=str(data), output_dir=str(tmp_path / "run"), epochs=1, callbacks=[AtStart()], **FAST)
    assert torch.count_nonzero(seen["precision"]) == 0  # rows 4..6 zeroed before training (spec 9)
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    logged = {key: float(value) for row in rows for key, value in row.items() if value}
    for key in ("val/keypoint_map_50_95", "val/keypoint_map_50", "val/keypoint_mAR", "val/mAP_50_95",
                "train/loss_keypoints_l1", "train/loss_keypoints_nll"):
        assert key in logged and math.isfinite(logged[key]), key
    best = torch.load(tmp_path / "run" / "checkpoint_best_ema.pth", map_location="cpu", weights_only=True)
    assert best["callbacks"]["BestModels"]["best"]["ema"] == logged["val/ema_keypoint_map_50_95"]


def test_keypoint_runs_rank_and_stop_on_keypoint_metrics(tmp_path):
    from detrkit.config import KeypointTrainConfig
    from detrkit.training import build_trainer
    from detrkit.training.checkpoints import BestModels

    for metric, key in (("map", "keypoint_map_50_95"), ("mar", "keypoint_mAR")):
        trainer = build_trainer(KeypointTrainConfig(dataset_dir=None, output_dir=str(tmp_path), progress_bar=None,
                                                    tensorboard=False, best_model_metric=metric))
        assert [c.key for c in trainer.callbacks if isinstance(c, BestModels)] == [key]
