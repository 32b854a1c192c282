"""The `detrkit` command and the demo, on tiny settings."""

import csv
import json

import numpy as np
import pytest
import supervision as sv
import torch

from detrkit import cli, demo
from detrkit.datasets.synthetic import make_synthetic_dataset


def test_demo_trains_reports_and_draws(tmp_path, monkeypatch, tiny_kwargs, capsys):
    tiny = {k: v for k, v in tiny_kwargs.items() if k not in ("device", "num_classes")}
    monkeypatch.setattr(demo, "DEMO_MODEL", tiny)
    monkeypatch.setattr(demo, "DEMO_TRAINING", {**demo.DEMO_TRAINING, "num_workers": 0, "progress_bar": None})
    result = demo.run_demo(tmp_path / "demo", epochs=2)
    assert len(result["map_by_epoch"]) == 2
    assert result["picture"].is_file() and result["picture"].stat().st_size > 1000
    out = capsys.readouterr().out
    assert "validation box mAP@50:95 by epoch" in out and str(result["picture"]) in out
    assert "mask mAP" not in out and "mask_map_by_epoch" not in result


def test_segment_demo_command_reports_mask_metrics_and_draws_masks(tmp_path, monkeypatch, tiny_kwargs, capsys):
    tiny = {k: v for k, v in tiny_kwargs.items() if k not in ("device", "num_classes")}
    monkeypatch.setattr(demo, "DEMO_SEG_MODEL", {**tiny, "patch_size": 16, "num_windows": 2})
    monkeypatch.setattr(demo, "DEMO_TRAINING", {**demo.DEMO_TRAINING, "num_workers": 0, "progress_bar": None})
    drawn = []
    draw = demo._draw
    monkeypatch.setattr(demo, "_draw", lambda image, detections: drawn.append(detections) or draw(image, detections))
    assert cli.main(["demo", "--task", "segment", "--output", str(tmp_path / "demo"), "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "validation mask mAP@50:95 by epoch: " in out and "validation box mAP@50:95 by epoch: " in out
    picture = tmp_path / "demo" / "predictions.png"
    assert picture.is_file() and str(picture) in out
    assert len(drawn) == 4 and all(d.mask is not None and d.mask.shape[1:] == (240, 320) for d in drawn)


def test_pose_demo_command_reports_keypoint_ap_and_draws_keypoints(tmp_path, monkeypatch, tiny_kwargs, capsys):
    tiny = {k: v for k, v in tiny_kwargs.items() if k not in ("device", "num_classes")}
    monkeypatch.setattr(demo, "DEMO_POSE_MODEL", {**tiny, "patch_size": 16, "num_windows": 2,
                                                  "num_keypoints_per_class": [4, 4, 4]})
    monkeypatch.setattr(demo, "DEMO_TRAINING", {**demo.DEMO_TRAINING, "num_workers": 0, "progress_bar": None})
    monkeypatch.setattr(demo, "DEMO_DATA", {**demo.DEMO_DATA, "num_train": 8, "num_valid": 4})  # 5 steps
    drawn = []
    draw = demo._draw
    monkeypatch.setattr(demo, "_draw", lambda image, found: drawn.append(found) or draw(image, found))
    assert cli.main(["demo", "--task", "pose", "--output", str(tmp_path / "demo"), "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "validation keypoint AP (OKS) @50:95 by epoch: " in out and "validation box mAP@50:95 by epoch: " in out
    assert "mask mAP" not in out
    picture = tmp_path / "demo" / "predictions.png"
    assert picture.is_file() and str(picture) in out
    assert len(drawn) == 4 and all(isinstance(k, sv.KeyPoints) and k.xy.shape[1:] == (4, 2) for k in drawn)
    annotations = json.loads((tmp_path / "demo" / "dataset" / "train" / "_annotations.coco.json").read_text())
    assert all(len(a["keypoints"]) == 12 for a in annotations["annotations"])


def test_demo_draws_keypoints_joined_in_order_over_their_boxes():
    from PIL import Image

    image = Image.new("RGB", (60, 40), (100, 100, 100))
    corners = np.array([[[10.0, 10], [30, 10], [30, 30], [10, 30]]], np.float32)
    found = sv.KeyPoints(xy=corners, keypoint_confidence=np.ones((1, 4), np.float32), class_id=np.array([0]),
                         detection_confidence=np.array([0.9], np.float32), visible=np.ones((1, 4), bool),
                         data={"xyxy": np.array([[40.0, 5, 55, 35]], np.float32),
                               "class_name": np.array(["square"], dtype=object)})
    drawn = np.asarray(demo._draw(image, found)).astype(int)
    assert (drawn[10, 10] == 0).all()  # a vertex, in black
    assert (drawn[20, 30] == 255).all() and (drawn[10, 20] == 255).all()  # edges, in white
    assert (drawn[20, 20] == 100).all()  # inside the keypoints: untouched
    assert (drawn[20, 40] != 100).any() and (drawn[20, 47] == 100).all()  # the box outline, not its inside


def test_demo_draws_masks_under_boxes():
    import numpy as np
    import supervision as sv
    from PIL import Image

    image = Image.new("RGB", (40, 30), (100, 100, 100))
    mask = np.zeros((1, 30, 40), bool)
    mask[0, 10:20, 5:15] = True
    detections = sv.Detections(xyxy=np.array([[25.0, 2, 38, 28]]), confidence=np.array([0.9]),
                               class_id=np.array([1]), mask=mask)
    drawn = np.asarray(demo._draw(image, detections)).astype(int)
    # mask pixel tinted; the box's inside below its label chip not
    assert (drawn[15, 10] != 100).any() and (drawn[24, 31] == 100).all()
    assert (drawn[15, 25] != 100).any()  # the box outline


def test_validation_history_reads_validated_rows(tmp_path):
    path = tmp_path / "metrics.csv"
    with open(path, "w", newline="") as stream:
        writer = csv.DictWriter(stream, ["epoch", "train/loss", "val/mAP_50_95"])
        writer.writeheader()
        writer.writerows([{"epoch": 0, "train/loss": 3}, {"epoch": 0, "val/mAP_50_95": 0.1},
                          {"epoch": 1, "val/mAP_50_95": 0.25}])
    assert demo.validation_history(path) == [0.1, 0.25]
    assert demo.validation_history(path, "train/loss") == [3.0]


def test_train_command_maps_options(tmp_path, capsys, monkeypatch, tiny_kwargs):
    from detrkit import RFDETRNano
    from detrkit.variants import VARIANTS

    # the tiny architecture behind "--model nano": the command line is under test, not the model
    monkeypatch.setitem(VARIANTS, "nano", lambda **kwargs: RFDETRNano(**{**tiny_kwargs, **kwargs}))
    data = make_synthetic_dataset(tmp_path / "data", num_train=4, num_valid=2, image_size=(64, 64))
    code = cli.main(["train", "--dataset", str(data), "--model", "nano", "--weights", "none", "--epochs", "1",
                     "--batch-size", "2", "--resolution", "64", "--output", str(tmp_path / "out"),
                     "--num-workers", "0", "--device", "cpu", "--set", "multi_scale=off", "--set",
                     "progress_bar=null", "--set", "tensorboard=false", "--set", "max_steps=2"])
    assert code == 0
    record = json.loads((tmp_path / "out" / "training_config.json").read_text())
    assert record["train_config"]["multi_scale"] == "off" and record["train_config"]["batch_size"] == 2
    assert record["model_config"]["resolution"] == 64
    assert record["train_config"]["resume"] is None and not record["train_config"]["early_stopping"]
    assert "training finished" in capsys.readouterr().out
    code = cli.main(["train", "--dataset", str(data), "--weights", "none", "--epochs", "2", "--batch-size", "2",
                     "--resolution", "64", "--output", str(tmp_path / "out"), "--num-workers", "0",
                     "--device", "cpu", "--resume", "last", "--early-stopping", "--set", "multi_scale=off",
                     "--set", "progress_bar=null", "--set", "tensorboard=false"])
    assert code == 0
    record = json.loads((tmp_path / "out" / "training_config.json").read_text())
    assert record["train_config"]["resume"] == "last" and record["train_config"]["early_stopping"]
    assert torch.load(tmp_path / "out" / "last.ckpt", weights_only=True)["epoch"] == 1


def test_set_requires_name_value(capsys):
    parser = cli._parser()
    with pytest.raises(SystemExit) as stopped:
        cli._parse_settings(["oops"], parser)
    assert stopped.value.code == 2 and "--set expects NAME=VALUE, got 'oops'" in capsys.readouterr().err
    assert cli._parse_settings(["lr=0.001", "run=name"], parser) == {"lr": 0.001, "run": "name"}


def test_predict_command_draws(tmp_path, capsys):
    assert cli.main(["predict", "--random-weights", "--device", "cpu", "--threshold", "0.99",
                     "--save-image", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").is_file()
    assert "detections at confidence > 0.99" in capsys.readouterr().out
