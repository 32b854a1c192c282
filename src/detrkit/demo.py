"""The built-in demo: generate a shapes data set, train a small-resolution Nano on it, show results."""

from __future__ import annotations

import csv
import time
import warnings
from pathlib import Path

from detrkit.config import PretrainWeightsCompatibilityWarning

# Small enough for a 2-core CPU in a few minutes, large enough to learn the shapes.
DEMO_MODEL = dict(pretrain_weights=None, resolution=224, num_queries=60, num_select=60, group_detr=4)
DEMO_TRAINING = dict(epochs=6, batch_size=4, lr=4e-4, lr_encoder=4e-4, multi_scale="off", scale_jitter=False,
                     num_workers=2, eval_interval=1, progress_bar="tqdm", tensorboard=False, seed=0,
                     warmup_epochs=0.0)


def run_demo(output: Path = Path("detrkit-demo"), device: str = "cpu", epochs: int | None = None) -> dict:
    """Train on generated data; returns the per-epoch validation mAP and the paths written."""
    from PIL import Image

    from detrkit.datasets.synthetic import make_synthetic_dataset
    from detrkit.render import draw_detections
    from detrkit.variants import RFDETRNano

    started = time.perf_counter()
    dataset = make_synthetic_dataset(output / "dataset", num_train=64, num_valid=16, seed=0)
    print(f"data set of coloured shapes written to {dataset}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainWeightsCompatibilityWarning)
        model = RFDETRNano(**DEMO_MODEL, device=device)
    settings = dict(DEMO_TRAINING, epochs=epochs or DEMO_TRAINING["epochs"])
    model.train(dataset_dir=str(dataset), output_dir=str(output / "run"), **settings)
    history = validation_history(output / "run" / "metrics.csv")
    images = sorted((dataset / "valid").glob("*.jpg"))[:4]
    picture = output / "predictions.png"
    tiles = [draw_detections(Image.open(p).convert("RGB"), model.predict(str(p), threshold=0.3)) for p in images]
    _grid(tiles).save(picture)
    print("\nvalidation mAP@50:95 by epoch: " + ", ".join(f"{m:.3f}" for m in history))
    print(f"predictions drawn on validation images: {picture}")
    print(f"metrics: {output / 'run' / 'metrics.csv'}; run settings: {output / 'run' / 'training_config.json'}")
    print(f"done in {time.perf_counter() - started:.0f} s")
    return {"map_by_epoch": history, "picture": picture, "dataset": dataset}


def validation_history(metrics_csv: Path) -> list[float]:
    """val/mAP_50_95 per validated epoch, in order, from Lightning's metrics.csv."""
    with open(metrics_csv, newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get("val/mAP_50_95")]
    return [float(row["val/mAP_50_95"]) for row in rows]


def _grid(tiles: list) -> "Image.Image":
    from PIL import Image

    width, height = tiles[0].size
    sheet = Image.new("RGB", (width * len(tiles), height), "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile.resize((width, height)), (index * width, 0))
    return sheet
