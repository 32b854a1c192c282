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
# RFDETRKeypointPreview's keypoint decoder on a Nano-sized model, 4 corner keypoints per shape class;
# fewer queries than the others, as every query carries 12 keypoint tokens through the decoder
DEMO_POSE_MODEL = dict(pretrain_weights=None, resolution=192, positional_encoding_size=12, patch_size=16,
                       num_windows=2, dec_layers=2, num_queries=30, num_select=30, group_detr=4,
                       num_keypoints_per_class=[4, 4, 4])
DEMO_POSE_TRAINING = dict(epochs=10, skip_best_epochs=0)  # keypoint AP starts rising after about 5 epochs
DEMO_DATA = dict(num_train=64, num_valid=16, seed=0)
DEMO_TRAINING = dict(epochs=6, batch_size=4, lr=4e-4, lr_encoder=4e-4, multi_scale="off", scale_jitter=False,
                     num_workers=2, eval_interval=1, progress_bar="tqdm", tensorboard=False, seed=0,
                     warmup_epochs=0.0)
TASKS = ("detect", "segment", "pose")


# the second metric each task prints beside the box mAP: (result key, metrics.csv column, wording)
TASK_METRICS = {"segment": ("mask_map_by_epoch", "val/segm_mAP_50_95", "mask mAP@50:95"),
                "pose": ("keypoint_map_by_epoch", "val/keypoint_map_50_95", "keypoint AP (OKS) @50:95")}


def run_demo(output: Path = Path("detrkit-demo"), device: str = "cpu", epochs: int | None = None,
             task: str = "detect") -> dict:
    """Train a detector (task "detect"), an instance segmentation model ("segment") or a keypoint
    model ("pose": the four corners of each shape) on generated data; returns the per-epoch
    validation box mAP (and mask mAP or keypoint AP) and the paths written."""
    from detrkit.datasets.synthetic import make_synthetic_dataset

    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    started = time.perf_counter()
    dataset = make_synthetic_dataset(output / "dataset", **DEMO_DATA, keypoints=task == "pose")
    print(f"data set of coloured shapes written to {dataset}")
    model, settings = _demo_model(task, device)
    model.train(dataset_dir=str(dataset), output_dir=str(output / "run"),
                **dict(settings, epochs=epochs or settings["epochs"]))
    metrics = output / "run" / "metrics.csv"
    result = {"map_by_epoch": validation_history(metrics), "dataset": dataset}
    print("\nvalidation box mAP@50:95 by epoch: " + _listed(result["map_by_epoch"]))
    if task in TASK_METRICS:
        name, column, wording = TASK_METRICS[task]
        result[name] = validation_history(metrics, column)
        print(f"validation {wording} by epoch: " + _listed(result[name]))
    result["picture"] = _draw_predictions(model, sorted((dataset / "valid").glob("*.jpg"))[:4], output)
    print(f"predictions drawn on validation images: {result['picture']} (ground truth dashed white, predictions "
          f"above {DEMO_THRESHOLD} solid; after a few epochs from scratch some objects still get two boxes, "
          f"which more epochs remove)")
    print(f"metrics: {metrics}; run settings: {output / 'run' / 'training_config.json'}")
    print(f"done in {time.perf_counter() - started:.0f} s")
    return result


def _demo_model(task: str, device: str) -> tuple[RFDETR, dict]:
    """The untrained demo model of `task` and its train() settings."""
    from detrkit.variants import RFDETRKeypointPreview, RFDETRNano, RFDETRSegNano

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PretrainWeightsCompatibilityWarning)
        if task == "pose":
            return RFDETRKeypointPreview(**DEMO_POSE_MODEL, device=device), {**DEMO_TRAINING, **DEMO_POSE_TRAINING}
        if task == "segment":
            return RFDETRSegNano(**DEMO_SEG_MODEL, device=device), DEMO_TRAINING
        return RFDETRNano(**DEMO_MODEL, device=device), DEMO_TRAINING


def validation_history(metrics_csv: Path, key: str = "val/mAP_50_95") -> list[float]:
    """`key` (box mAP@50:95 by default) per validated epoch, in order, from Lightning's metrics.csv."""
    with open(metrics_csv, newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row.get(key)]
    return [float(row[key]) for row in rows]


def _listed(values: list[float]) -> str:
    return ", ".join(f"{value:.3f}" for value in values)


DEMO_THRESHOLD = 0.3  # the confidence above which predictions are drawn


def _draw_predictions(model: RFDETR, images: list[Path], output: Path) -> Path:
    """One picture of `images` side by side: ground truth dashed white, predictions above DEMO_THRESHOLD
    solid in their class colours (masks under boxes, keypoints over them), with counts under each."""
    from PIL import Image

    from detrkit.render import caption, draw_ground_truth

    truth = _ground_truth_boxes(images[0].parent / "_annotations.coco.json") if images else {}
    tiles = []
    for path in images:
        image = Image.open(path).convert("RGB")
        prediction = model.predict(image, threshold=DEMO_THRESHOLD)
        boxes = truth.get(path.name, [])
        tile = _draw(draw_ground_truth(image, boxes), prediction)
        tiles.append(caption(tile, f"truth {len(boxes)} (dashed), predicted {len(prediction)} >= {DEMO_THRESHOLD}"))
    picture = output / "predictions.png"
    _grid(tiles).save(picture)
    return picture


def _ground_truth_boxes(annotations: Path) -> dict[str, list[list[float]]]:
    """File name -> its boxes as xyxy pixels, from a COCO annotation file."""
    import json

    coco = json.loads(annotations.read_text())
    names = {image["id"]: image["file_name"] for image in coco["images"]}
    boxes: dict[str, list[list[float]]] = {}
    for annotation in coco["annotations"]:
        x, y, w, h = annotation["bbox"]
        boxes.setdefault(names[annotation["image_id"]], []).append([x, y, x + w, y + h])
    return boxes


def _draw(image: Image.Image, prediction: sv.Detections | sv.KeyPoints) -> Image.Image:
    """Boxes over masks (if any); for keypoint predictions, their boxes and each shape's corners
    joined in order."""
    import numpy as np
    import supervision as sv
    from PIL import Image

    from detrkit.datasets.synthetic import CORNER_SKELETON
    from detrkit.render import _PALETTE, draw_detections

    if isinstance(prediction, sv.KeyPoints):
        edges = sv.EdgeAnnotator(color=sv.Color.WHITE, thickness=1, edges=[tuple(e) for e in CORNER_SKELETON])
        image = sv.VertexAnnotator(color=sv.Color.BLACK, radius=2).annotate(
            edges.annotate(image.copy(), prediction), prediction)
        prediction = sv.Detections(xyxy=prediction.data["xyxy"].reshape(-1, 4),
                                   confidence=prediction.detection_confidence, class_id=prediction.class_id,
                                   data={"class_name": prediction.data["class_name"]})
    elif prediction.mask is not None:  # in the colours of the boxes
        annotator = sv.MaskAnnotator(color=sv.ColorPalette([sv.Color(*rgb) for rgb in _PALETTE]), opacity=0.5)
        image = Image.fromarray(annotator.annotate(np.array(image), prediction))
    return draw_detections(image, prediction)


def _grid(tiles: list[Image.Image]) -> Image.Image:
    from PIL import Image

    width, height = tiles[0].size
    gap = 4
    sheet = Image.new("RGB", (width * len(tiles) + gap * (len(tiles) - 1), height), "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile.resize((width, height)), (index * (width + gap), 0))
    return sheet
