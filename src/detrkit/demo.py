"""The built-in demo: generate a shapes data set, train a small model on it from scratch, show results."""

from __future__ import annotations

import csv
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from detrkit.config import PretrainWeightsCompatibilityWarning

if TYPE_CHECKING:
    import supervision as sv
    from PIL import Image

    from detrkit.detr import RFDETR

# Small enough for a 2-core CPU in a few minutes, large enough to learn the shapes.
DEMO_MODEL = dict(pretrain_weights=None, resolution=224, num_queries=60, num_select=60, group_detr=4)
# RFDETRSegNano's architecture (12 px patches, one window) at a lower resolution
DEMO_SEG_MODEL = dict(pretrain_weights=None, resolution=192, num_queries=60, num_select=60, group_detr=4)
DEMO_TRAINING = dict(epochs=6, batch_size=4, lr=4e-4, lr_encoder=4e-4, multi_scale="off", scale_jitter=False,
                     num_workers=2, eval_interval=1, progress_bar="tqdm", tensorboard=False, seed=0,
                     warmup_epochs=0.0)
TASKS = ("detect", "segment")


def run_demo(output: Path = Path("detrkit-demo"), device: str = "cpu", epochs: int | None = None,
             task: str = "detect") -> dict:
    """Train a detector (task "detect") or an instance segmentation model ("segment") on generated
    data; returns the per-epoch validation box mAP (and mask mAP) and the paths written."""
    from detrkit.datasets.synthetic import make_synthetic_dataset
    from detrkit.variants import RFDETRNano, RFDETRSegNano

    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    segment = task == "segment"
    started = time.perf_counter()
    dataset = make_synthetic_dataset(output / "dataset", num_train=64, num_valid=16, seed=0)
    print(f"data set of coloured shapes written to {dataset}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainWeightsCompatibilityWarning)
        model = (RFDETRSegNano(**DEMO_SEG_MODEL, device=device) if segment
                 else RFDETRNano(**DEMO_MODEL, device=device))
    settings = dict(DEMO_TRAINING, epochs=epochs or DEMO_TRAINING["epochs"])
    model.train(dataset_dir=str(dataset), output_dir=str(output / "run"), **settings)
    metrics = output / "run" / "metrics.csv"
    result = {"map_by_epoch": validation_history(metrics), "dataset": dataset}
    print("\nvalidation box mAP@50:95 by epoch: " + _listed(result["map_by_epoch"]))
    if segment:
        result["mask_map_by_epoch"] = validation_history(metrics, "val/segm_mAP_50_95")
        print("validation mask mAP@50:95 by epoch: " + _listed(result["mask_map_by_epoch"]))
    result["picture"] = _draw_predictions(model, sorted((dataset / "valid").glob("*.jpg"))[:4], output)
    print(f"predictions drawn on validation images: {result['picture']}")
    print(f"metrics: {metrics}; run settings: {output / 'run' / 'training_config.json'}")
    print(f"done in {time.perf_counter() - started:.0f} s")
    return result


def validation_history(metrics_csv: Path, key: str = "val/mAP_50_95") -> list[float]:
    """`key` (box mAP@50:95 by default) per validated epoch, in order, from Lightning's metrics.csv."""
    with open(metrics_csv, newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get(key)]
    return [float(row[key]) for row in rows]


def _listed(values: list[float]) -> str:
    return ", ".join(f"{value:.3f}" for value in values)


def _draw_predictions(model: RFDETR, images: list[Path], output: Path) -> Path:
    """One picture of the predictions on `images`, side by side: masks (if any) under boxes."""
    from PIL import Image

    tiles = []
    for path in images:
        image = Image.open(path).convert("RGB")
        tiles.append(_draw(image, model.predict(image, threshold=0.3)))
    picture = output / "predictions.png"
    _grid(tiles).save(picture)
    return picture


def _draw(image: Image.Image, detections: sv.Detections) -> Image.Image:
    import numpy as np
    import supervision as sv
    from PIL import Image

    from detrkit.render import _PALETTE, draw_detections

    if detections.mask is not None:  # in the colours of the boxes
        annotator = sv.MaskAnnotator(color=sv.ColorPalette([sv.Color(*rgb) for rgb in _PALETTE]), opacity=0.5)
        image = Image.fromarray(annotator.annotate(np.array(image), detections))
    return draw_detections(image, detections)


def _grid(tiles: list[Image.Image]) -> Image.Image:
    from PIL import Image

    width, height = tiles[0].size
    sheet = Image.new("RGB", (width * len(tiles), height), "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile.resize((width, height)), (index * width, 0))
    return sheet
