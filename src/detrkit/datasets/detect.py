"""Recognise a data set folder's format and build its validated train/valid/test splits from the configs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from detrkit.config import DatasetFormat, ModelConfig, TrainConfig
from detrkit.datasets import coco, yolo
from detrkit.datasets.detection import DetectionDataset
from detrkit.datasets.augmentation import build_augmentation
from detrkit.datasets.transforms import build_eval_transform, sample_scales

# format -> reader of (train, valid, test or None); the only place that branches on the name
READERS = {"roboflow": coco.roboflow_splits, "coco": coco.coco2017_splits, "yolo": yolo.yolo_splits}

# the file whose presence identifies each format, in the order they are tried
MARKERS: tuple[tuple[DatasetFormat, tuple[str, ...]], ...] = (
    ("roboflow", (f"train/{coco.ROBOFLOW_ANNOTATIONS}",)),
    ("coco", ("annotations/instances_train2017.json",)),
    ("yolo", yolo.YAML_FILES),
)


@dataclass
class DatasetSplits:
    """The splits of one data set and its classes; `test` is None when the data set has none."""

    train: DetectionDataset
    valid: DetectionDataset
    test: DetectionDataset | None
    class_names: list[str]
    num_classes: int


def detect_format(dataset_dir: str | Path) -> DatasetFormat:
    """"roboflow", "coco" or "yolo", by which marker file the folder holds."""
    root = Path(dataset_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset_dir {root} does not exist or is not a folder")
    for name, files in MARKERS:
        if any((root / file).is_file() for file in files):
            return name
    looked = ", ".join(str(root / file) for _, files in MARKERS for file in files)
    raise ValueError(f"cannot tell the format of data set {root}: none of {looked} exists")


def build_datasets(train_config: TrainConfig, model_config: ModelConfig, masks: bool | None = None) -> DatasetSplits:
    """Read and check every split up front (annotations, categories, image files, and with
    `masks` the segmentations), with the training and evaluation transforms that the configs
    describe. `masks` defaults to the model having a segmentation head."""
    if train_config.dataset_dir is None:
        raise ValueError("TrainConfig.dataset_dir is not set; it must name the data set folder")
    root = Path(train_config.dataset_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset_dir {root} does not exist or is not a folder")
    dataset_format = train_config.dataset_file or detect_format(root)
    scales = sample_scales(train_config.multi_scale, model_config.resolution, model_config.block_size,
                           train_config.expanded_scales)
    square = train_config.square_resize_div_64
    train_transform = build_augmentation(train_config).train_transform(scales, square, train_config.scale_jitter)
    eval_transform = build_eval_transform(model_config.resolution, square)
    masks = model_config.segmentation_head if masks is None else masks
    train, valid, test = READERS[dataset_format](root, train_transform, eval_transform, masks)
    names = train.class_names
    if train_config.class_names is not None and list(train_config.class_names) != names:
        raise ValueError(f"TrainConfig.class_names {train_config.class_names} differ from the class "
                         f"names {names} of data set {root}")
    return DatasetSplits(train, valid, test, names, len(names))
