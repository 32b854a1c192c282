"""Read YOLO-format folders (data.yaml plus <split>/images and <split>/labels) into detection datasets."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import yaml

from detrkit.datasets.detection import DetectionDataset, ImageRecord, SampleTransform

YAML_FILES = ("data.yaml", "data.yml")
IMAGE_EXTENSIONS = frozenset({".bmp", ".dng", ".jpg", ".jpeg", ".mpo", ".png", ".tif", ".tiff", ".webp"})
SPLIT_FOLDERS = {"train": ("train",), "valid": ("valid", "val"), "test": ("test",)}


class YoloDetection(DetectionDataset):
    """One split folder: images in `split_dir/images`, `<stem>.txt` labels in `split_dir/labels`;
    an image without a label file is background. Image ids count images in name order."""

    def __init__(self, split_dir: str | os.PathLike, class_names: list[str], transform: SampleTransform) -> None:
        split_dir = Path(split_dir)
        image_dir, label_dir = split_dir / "images", split_dir / "labels"
        for folder in (image_dir, label_dir):
            if not folder.is_dir():
                raise FileNotFoundError(f"YOLO split folder {folder} does not exist")
        images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        records, degenerate = [], 0
        for image_id, image in enumerate(images):
            boxes, labels, dropped = read_label_file(label_dir / f"{image.stem}.txt", len(class_names))
            degenerate += dropped
            records.append(ImageRecord(path=image, image_id=image_id, boxes=boxes, labels=labels,
                                       iscrowd=np.zeros(len(labels), dtype=bool)))
        if degenerate:
            warnings.warn(f"dropped {degenerate} degenerate boxes (width or height <= 0 after clamping to "
                          f"the image) in {label_dir}", stacklevel=2)
        super().__init__(records, class_names, transform)


def find_yaml(root: Path) -> Path | None:
    return next((root / name for name in YAML_FILES if (root / name).is_file()), None)


def read_class_names(path: Path) -> list[str]:
    """`names` of a data.yaml: a list, or a dict {index: name} with indices 0..N-1."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"invalid YAML in {path}: {error}") from error
    names = data.get("names") if isinstance(data, dict) else None
    if isinstance(names, dict):
        if sorted(names) != list(range(len(names))):
            raise ValueError(f"{path}: 'names' keys must be the indices 0..{len(names) - 1}, got {list(names)}")
        names = [names[index] for index in range(len(names))]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path} needs a 'names' entry: a list of class names or a dict "
                         f"{{index: name}}, got {names!r}")
    return [str(name) for name in names]


def read_label_file(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(boxes (N, 4) xyxy normalised and clamped, labels (N,), count of degenerate boxes dropped)
    from lines `cls cx cy w h` or `cls x1 y1 ... xn yn` (box = polygon bounds)."""
    boxes, labels, degenerate = [], [], 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except UnicodeDecodeError as error:
        raise ValueError(f"label file {path} is not UTF-8 text: {error}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        label, box = _parse_line(line, path, number, num_classes)
        box = np.clip(box, 0.0, 1.0)
        if box[2] <= box[0] or box[3] <= box[1]:
            degenerate += 1
            continue
        boxes.append(box)
        labels.append(label)
    return (np.array(boxes, dtype=np.float32).reshape(-1, 4), np.array(labels, dtype=np.int64), degenerate)


def _parse_line(line: str, path: Path, number: int, num_classes: int) -> tuple[int, np.ndarray]:
    fields = line.split()
    try:
        values = [float(field) for field in fields]
    except ValueError as error:
        raise ValueError(f"{path} line {number}: {error} in {line!r}") from error
    if not np.isfinite(values).all():
        raise ValueError(f"{path} line {number}: non-finite value in {line!r}")
    if len(values) != 5 and (len(values) < 7 or len(values) % 2 == 0):
        raise ValueError(f"{path} line {number}: expected 'cls cx cy w h' or 'cls x1 y1 ... xn yn' "
                         f"(n >= 3), got {len(values)} values")
    label = values[0]
    if label != int(label) or not 0 <= label < num_classes:
        raise ValueError(f"{path} line {number}: class {fields[0]} is not one of the "
                         f"{num_classes} class indices 0..{num_classes - 1}")
    if len(values) == 5:
        cx, cy, w, h = values[1:]
        return int(label), np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    points = np.array(values[1:]).reshape(-1, 2)  # (n, 2) polygon vertices x, y
    return int(label), np.concatenate([points.min(axis=0), points.max(axis=0)])


def yolo_splits(root: Path, train_transform: SampleTransform, eval_transform: SampleTransform,
                ) -> tuple[YoloDetection, YoloDetection, YoloDetection | None]:
    """train and valid (or val) are required, test is optional; names from data.yaml / data.yml."""
    yaml_file = find_yaml(root)
    if yaml_file is None:
        raise FileNotFoundError(f"no {' or '.join(YAML_FILES)} in YOLO data set {root}")
    names = read_class_names(yaml_file)
    folders = {split: next((root / f for f in options if (root / f).is_dir()), None)
               for split, options in SPLIT_FOLDERS.items()}
    for split in ("train", "valid"):
        if folders[split] is None:
            looked = " or ".join(str(root / f) for f in SPLIT_FOLDERS[split])
            raise FileNotFoundError(f"YOLO data set {root} has no {split} split: looked for {looked}")
    train = YoloDetection(folders["train"], names, train_transform)
    valid = YoloDetection(folders["valid"], names, eval_transform)
    test = YoloDetection(folders["test"], names, eval_transform) if folders["test"] else None
    return train, valid, test
