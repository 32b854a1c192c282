"""Segmentation through the training loop: mask losses, mask metrics, best weights by mask mAP."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from tiny_config import TINY

from detrkit import RFDETR
from detrkit.config import SegmentationTrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.models.postprocess import masks_at_size, valid_mask_region
from detrkit.structures import Target
from detrkit.training.checkpoints import metric_key
from detrkit.training.coco_backends.rle import EncodedMasks, decode_runs, split_runs
from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision
from detrkit.training.evaluation import DetectionEvaluator, with_masks
from detrkit.variants import RFDETRSegNano

FAST = dict(batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


def decoded(masks: EncodedMasks) -> torch.Tensor:
    runs = split_runs(masks.runs.numpy(), masks.lengths.numpy())
    return torch.stack([torch.from_numpy(decode_runs(r, *masks.size)) for r in runs]) if runs else torch.zeros(
        (0, *masks.size), dtype=torch.bool)


@pytest.fixture(scope="module")
def seg_run(tmp_path_factory) -> tuple[RFDETR, Path]:
    data = make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=3,
                                  image_size=(96, 64), seed=0)
    output = tmp_path_factory.mktemp("seg_run")
    torch.manual_seed(0)
    model = RFDETRSegNano(**{**TINY, "patch_size": 16, "num_windows": 2})
    model.train(dataset_dir=str(data), output_dir=str(output), epochs=2, checkpoint_interval=1, **FAST)
    return model, output


def test_segmentation_models_train_with_mask_losses_and_log_mask_metrics(seg_run):
    model, output = seg_run
    rows = list(csv.DictReader((output / "metrics.csv").open()))
    last = {key: value for row in rows if row["epoch"] == "1" for key, value in row.items() if value}
    for key in ("train/loss_mask_ce", "train/loss_mask_dice", "train/loss_mask_ce_aux", "val/segm_mAP_50_95",
                "val/segm_mAP_50", "val/segm_mAP_75", "val/segm_mAR", "val/mAP_50_95", "val/ema_segm_mAP_50_95"):
        assert key in last, key
        assert math.isfinite(float(last[key])) and float(last[key]) >= 0, key
    assert 0 <= float(last["val/segm_mAP_50_95"]) <= 1
    assert model.model.segmentation_head is not None
    checkpoint = torch.load(output / "checkpoint_best_ema.pth", map_location="cpu", weights_only=True)
    best = max(float(row["val/ema_segm_mAP_50_95"]) for row in rows if row.get("val/ema_segm_mAP_50_95"))
    assert checkpoint["callbacks"]["BestModels"]["best"]["ema"] == pytest.approx(best)
    assert checkpoint["model_name"] == "RFDETRSegNano"


def test_segmentation_runs_rank_weights_by_mask_map(tmp_path):
    from detrkit.training import build_trainer
    from detrkit.training.callbacks.early_stopping import MetricEarlyStopping
    from detrkit.training.checkpoints import BestModels

    trainer = build_trainer(SegmentationTrainConfig(dataset_dir=None, output_dir=str(tmp_path), early_stopping=True,
                                                    progress_bar=None, tensorboard=False))
    assert [c.key for c in trainer.callbacks if isinstance(c, BestModels)] == ["segm_mAP_50_95"]
    stopping = [c for c in trainer.callbacks if isinstance(c, MetricEarlyStopping)]
    assert len(stopping) == 1 and "segm_mAP_50_95" in str(vars(stopping[0]))
    assert metric_key("map", segmentation=True) == "segm_mAP_50_95"
    assert metric_key("mar", segmentation=True) == "mAR"
    assert metric_key("map") == "mAP_50_95"
    assert RFDETRSegNano.train_config_class is SegmentationTrainConfig


def test_with_masks_upsamples_the_valid_region_and_resizes_ground_truth():
    torch.manual_seed(0)
    logits = torch.randn(3, 8, 12)  # (K, h, w) over a padded 32 x 48 input
    target = Target(boxes=torch.tensor([[0.5, 0.5, 0.5, 0.5]]), labels=torch.tensor([1]), image_id=0,
                    orig_size=(50, 60), size=(24, 40), masks=torch.zeros(1, 24, 40, dtype=torch.bool))
    target.masks[0, 6:18, 10:30] = True
    detections = [{"scores": torch.rand(3), "labels": torch.tensor([0, 1, 1]), "boxes": torch.rand(3, 4),
                   "masks": logits}]
    truth = [{"boxes": torch.tensor([[15.0, 12.5, 45.0, 37.5], [0.0, 0.0, 6.0, 5.0]]), "labels": torch.tensor([1, 1]),
              "iscrowd": torch.tensor([0, 1]), "area": torch.tensor([0.0, 0.0])}]  # one crowd region appended
    with_masks(detections, truth, [target], padded_size=(32, 48), head_resolution=False)
    valid = valid_mask_region((8, 12), (32, 48), (24, 40))
    assert valid == (6, 10)
    assert torch.equal(decoded(detections[0]["masks"]), masks_at_size(logits, valid, (50, 60)))
    gt = decoded(truth[0]["masks"])
    assert gt.shape == (2, 50, 60)
    rows, columns = gt[0].nonzero().unbind(1)  # the 12 x 20 box scaled by 50/24 and 60/40
    assert (rows.min().item(), rows.max().item(), columns.min().item(), columns.max().item()) == (13, 37, 15, 44)
    assert gt[1].sum() == 6 * 5 and gt[1, :5, :6].all()  # the crowd box, filled

    detections[0]["masks"], truth[0].pop("masks")
    detections = [{**detections[0], "masks": logits}]
    with_masks(detections, truth, [target], padded_size=(32, 48), head_resolution=True)
    assert detections[0]["masks"].size == truth[0]["masks"].size == (6, 10)


def test_encoded_masks_score_exactly_as_dense_masks():
    torch.manual_seed(1)
    preds, targets = [], []
    for _ in range(4):
        gt = torch.rand(3, 20, 30) > 0.6
        det = gt[torch.tensor([0, 2, 1, 0])] ^ (torch.rand(4, 20, 30) > 0.9)
        preds.append({"boxes": torch.rand(4, 4) * 20, "scores": torch.rand(4), "labels": torch.tensor([0, 1, 1, 0]),
                      "masks": det})
        targets.append({"boxes": torch.rand(3, 4) * 20, "labels": torch.tensor([0, 1, 1]), "masks": gt})
    dense = OnePassCocoMeanAveragePrecision(iou_type=("bbox", "segm"))
    dense.update(preds, targets)
    encoded = DetectionEvaluator(max_dets=100, masks=True)
    encoded.add([{**p, "masks": EncodedMasks.encode(p["masks"])} for p in preds],
                [{**t, "masks": EncodedMasks.encode(t["masks"])} for t in targets])
    expected, got = dense.compute(), encoded.compute()
    assert got["segm_mAP_50_95"] == float(expected["segm_map"]) > 0
    assert got["segm_mAP_50"] == float(expected["segm_map_50"])
    assert got["mAP_50_95"] == float(expected["bbox_map"])
