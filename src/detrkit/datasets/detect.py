"""Recognise a data set folder's format and build its validated train/valid/test splits from the configs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from detrkit.config import DatasetFormat, ModelConfig, TrainConfig
from detrkit.datasets import coco, yolo
from detrkit.datasets.augmentation import build_augmentation
from detrkit.datasets.detection import DetectionDataset
from detrkit.datasets.image_check import ImageScreen
from detrkit.datasets.keypoint_schema import KeypointFlip, KeypointSchema, resolve_flip
from detrkit.datasets.transforms import build_eval_transform, sample_scales

# format -> reader of (train, valid, test or None); the only place that branches on the name
READERS = {"roboflow": coco.roboflow_splits, "coco": coco.coco2017_splits, "yolo": yolo.yolo_splits}

# the file whose presence identifies each format, in the order they are tried
MARKERS: tuple[tuple[DatasetFormat, tuple[str, ...]], ...] = (
    ("roboflow", (f"train/{coco.ROBOFLOW_ANNOTATIONS}",)),
    ("coco", ("annotations/instances_train2017.json", "annotations/person_keypoints_train2017.json")),
    ("yolo", yolo.YAML_FILES),
)


@dataclass
class DatasetSplits:
    """The splits of one data set and its classes; `test` is None when the data set has none.
    Keypoint data sets add their schema and the flip map the training pipeline uses (pass it to
    build_augmentation for a batch-level backend)."""

    train: DetectionDataset
    valid: DetectionDataset
    test: DetectionDataset | None
    class_names: list[str]
    num_classes: int
    keypoint_schema: KeypointSchema | None = None
    keypoint_flip: KeypointFlip | None = None
    dataset_format: DatasetFormat | None = None  # how the folder was read (None: splits built by hand)
    dataset_dir: str | None = None


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


def build_datasets(train_config: TrainConfig, model_config: ModelConfig, masks: bool | None = None,
                   keypoints: bool | None = None) -> DatasetSplits:
    """Read and check every split up front (annotations, categories, image files, and with
    `masks` the segmentations, with `keypoints` the keypoints and the flip map a mirroring
    pipeline needs), with the training and evaluation transforms that the configs describe.
    `masks` defaults to the model having a segmentation head, `keypoints` to it having keypoint
    heads; the keypoint schema is the model's num_keypoints_per_class, or the data's when empty.

    Every split's image files are checked too (datasets/image_check.py, with a progress bar on the
    first process): a missing, unreadable or truncated file, or one whose size differs from its
    annotations, raises one BadImagesError naming them, or with `skip_bad_images` is left out with
    a warning."""
    if train_config.dataset_dir is None:
        raise ValueError("TrainConfig.dataset_dir is not set; it must name the data set folder")
    root = Path(train_config.dataset_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset_dir {root} does not exist or is not a folder")
    dataset_format = train_config.dataset_file or detect_format(root)
    scales = sample_scales(train_config.multi_scale, model_config.resolution, model_config.block_size,
                           train_config.expanded_scales)
    square, jitter = train_config.square_resize_div_64, train_config.scale_jitter
    augmentation = build_augmentation(train_config)
    eval_transform = build_eval_transform(model_config.resolution, square)
    masks = model_config.segmentation_head if masks is None else masks
    keypoints = model_config.use_grouppose_keypoints if keypoints is None else keypoints
    counts = list(model_config.num_keypoints_per_class) if keypoints else None
    progress = train_config.progress_bar is not None and int(os.environ.get("LOCAL_RANK", "0")) == 0
    screen = ImageScreen(skip=train_config.skip_bad_images, progress=progress)
    train, valid, test = READERS[dataset_format](root, augmentation.train_transform(scales, square, jitter),
                                                 eval_transform, masks, counts, screen)
    screen.finish()
    for dataset in (train, valid, test):
        if dataset is not None:  # an image that breaks after this check: skipped as well, when reading it
            dataset.skip_unreadable = train_config.skip_bad_images
    flip = None
    if keypoints:
        flip = resolve_flip(train.keypoint_schema, train_config.keypoint_flip_pairs, augmentation.mirrors)
        train.transform = augmentation.train_transform(scales, square, jitter, flip)  # now with the flip map
    names = train.class_names
    if train_config.class_names is not None and list(train_config.class_names) != names:
        raise ValueError(f"TrainConfig.class_names {train_config.class_names} differ from the class "
                         f"names {names} of data set {root}")
    return DatasetSplits(train, valid, test, names, len(names), train.keypoint_schema, flip, dataset_format, str(root))
