"""model.train() end to end on tiny models and data: formats, files, logs, errors, PTL API."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from detrkit import RFDETRNano
from detrkit.datasets.synthetic import make_synthetic_dataset

FAST = dict(epochs=1, batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0)


@pytest.fixture(scope="module")
def roboflow_dir(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=3,
                                  num_test=2, image_size=(96, 64), seed=0)


def to_plain_coco(roboflow: Path, root: Path) -> Path:
    """annotations/instances_{train,val}2017.json + train2017/ and val2017/."""
    (root / "annotations").mkdir(parents=True)
    for split, name in (("train", "train2017"), ("valid", "val2017")):
        shutil.copytree(roboflow / split, root / name, ignore=shutil.ignore_patterns("*.json"))
        shutil.copy(roboflow / split / "_annotations.coco.json", root / "annotations" / f"instances_{name}.json")
    return root


def to_yolo(roboflow: Path, root: Path) -> Path:
    names = None
    for split in ("train", "valid"):
        data = json.loads((roboflow / split / "_annotations.coco.json").read_text())
        kept = [c for c in sorted(data["categories"], key=lambda c: c["id"]) if c["name"] != "shapes"]
        names = [c["name"] for c in kept]
        label_of = {c["id"]: i for i, c in enumerate(kept)}
        (root / split / "images").mkdir(parents=True)
        (root / split / "labels").mkdir(parents=True)
        for image in data["images"]:
            shutil.copy(roboflow / split / image["file_name"], root / split / "images" / image["file_name"])
            lines = []
            for a in (a for a in data["annotations"] if a["image_id"] == image["id"]):
                x, y, w, h = a["bbox"]
                W, H = image["width"], image["height"]
                lines.append(f"{label_of[a['category_id']]} {(x + w / 2) / W} {(y + h / 2) / H} {w / W} {h / H}")
            stem = Path(image["file_name"]).stem
            (root / split / "labels" / f"{stem}.txt").write_text("\n".join(lines))
    (root / "data.yaml").write_text(json.dumps({"names": names}))
    return root


def read_metrics(output: Path) -> list[dict]:
    with open(output / "metrics.csv", newline="") as stream:
        return list(csv.DictReader(stream))


@pytest.mark.parametrize("layout", ["roboflow", "coco", "yolo"])
def test_trains_on_each_layout_and_logs_metrics(layout, roboflow_dir, tmp_path, tiny_kwargs):
    data = {"roboflow": lambda: roboflow_dir, "coco": lambda: to_plain_coco(roboflow_dir, tmp_path / "coco"),
            "yolo": lambda: to_yolo(roboflow_dir, tmp_path / "yolo")}[layout]()
    model = RFDETRNano(**{**tiny_kwargs, "num_classes": 90})
    before = model.model.class_embed.weight.detach().clone()
    model.train(dataset_dir=str(data), output_dir=str(tmp_path / "out"), **FAST)
    assert model.class_names == ["circle", "square", "triangle"]
    assert model.model.class_embed.out_features == 91  # explicit num_classes kept
    rows = read_metrics(tmp_path / "out")
    columns = set(rows[0])
    for name in ("train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/loss_ce_aux",
                 "val/mAP_50_95", "val/mAP_50", "val/mAP_75", "val/mAR", "val/precision", "val/recall", "val/F1"):
        assert name in columns, name
    losses = [float(r["train/loss"]) for r in rows if r["train/loss"]]
    assert losses and all(loss > 0 for loss in losses)
    maps = [float(r["val/mAP_50_95"]) for r in rows if r["val/mAP_50_95"]]
    assert len(maps) == 1 and 0.0 <= maps[0] <= 1.0
    assert not torch.equal(before, model.model.class_embed.weight[: before.shape[0]])  # it learned


def test_head_sized_to_dataset_and_config_written(roboflow_dir, tmp_path, tiny_kwargs):
    tiny_kwargs.pop("num_classes")
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), **FAST)
    assert model.model.class_embed.out_features == 4
    assert all(h.out_features == 4 for h in model.model.transformer.enc_out_class_embed)
    record = json.loads((tmp_path / "out" / "training_config.json").read_text())
    assert record["class_names"] == ["circle", "square", "triangle"] and record["num_classes"] == 3
    assert record["train_config"]["epochs"] == 1 and record["model_config"]["num_classes"] == 3
    assert record["model_config_type"] == "RFDETRNanoConfig"
    detections = model.predict(str(next((roboflow_dir / "valid").glob("*.jpg"))), threshold=0.0)
    assert set(detections.data["class_name"]) <= {"circle", "square", "triangle", "__background__"}


def test_eval_interval_still_validates_last_epoch(roboflow_dir, tmp_path, tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"),
                **{**FAST, "epochs": 3, "eval_interval": 2, "multi_scale": "per-batch"})
    validated = [int(r["epoch"]) for r in read_metrics(tmp_path / "out") if r["val/mAP_50_95"]]
    assert validated == [1, 2]


def test_run_test_logs_test_metrics(roboflow_dir, tmp_path, tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), **{**FAST, "run_test": True})
    assert any(r.get("test/mAP_50_95") for r in read_metrics(tmp_path / "out"))


def test_unknown_keys_raise_before_anything_is_written(roboflow_dir, tmp_path, tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    with pytest.raises(ValidationError, match="gradient_checkpointing"):
        model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), gradient_checkpointing=True)
    with pytest.raises(ValidationError, match="epochz"):
        model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), epochz=3)
    assert not (tmp_path / "out").exists()


def test_trainer_arguments_pass_through(roboflow_dir, tmp_path, tiny_kwargs):
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), limit_val_batches=1,
                **{**FAST, "epochs": 1})
    assert read_metrics(tmp_path / "out")


def test_broken_dataset_fails_before_output_is_written(roboflow_dir, tmp_path, tiny_kwargs):
    broken = tmp_path / "broken"
    shutil.copytree(roboflow_dir, broken)
    (broken / "valid" / "_annotations.coco.json").write_text("{not json")
    model = RFDETRNano(**tiny_kwargs)
    with pytest.raises(ValueError, match="_annotations.coco.json"):
        model.train(dataset_dir=str(broken), output_dir=str(tmp_path / "out"), **FAST)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        model.train(dataset_dir=str(tmp_path / "nowhere"), output_dir=str(tmp_path / "out"), **FAST)
    assert not (tmp_path / "out").exists()


def test_custom_lightning_loop_from_the_public_pieces(roboflow_dir, tmp_path, tiny_kwargs):
    import pytorch_lightning as pl

    from detrkit.config import TrainConfig
    from detrkit.training import RFDETRDataModule, RFDETRModelModule, build_trainer
    from detrkit.variants import RFDETRNanoConfig

    class CountSteps(pl.Callback):
        steps = 0

        def on_train_batch_end(self, *args):
            CountSteps.steps += 1

    model_config = RFDETRNanoConfig(**{**tiny_kwargs, "num_classes": 3})
    train_config = TrainConfig(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), **FAST)
    data = RFDETRDataModule(model_config, train_config)
    trainer = build_trainer(train_config, callbacks=[CountSteps()], max_steps=2)
    assert trainer.num_devices == 1
    trainer.fit(RFDETRModelModule(model_config, train_config), datamodule=data)
    assert CountSteps.steps == 2


def test_all_query_groups_train_even_after_predict(roboflow_dir, tmp_path, tiny_kwargs):
    import pytorch_lightning as pl

    seen = []

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(module.model.training)

    model = RFDETRNano(**tiny_kwargs)
    model.predict(torch.rand(3, 64, 64))  # leaves the detector in eval mode
    model.train(dataset_dir=str(roboflow_dir), output_dir=str(tmp_path / "out"), callbacks=[Watch()], **FAST)
    assert seen and all(seen)
    assert not model.model.training  # back in eval mode for predict
