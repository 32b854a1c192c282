"""Read YOLO data sets (a data.yaml naming classes and split images; label .txt files) into detection datasets.

Two layouts: Roboflow's `<split>/images` + `<split>/labels`, and Ultralytics' `images/<split>` +
`labels/<split>` with `train:`/`val:`/`test:` in data.yaml naming folders, list files of image
paths, or lists of either. An image's label file swaps the rightmost `images` path segment for
`labels` and the extension for `.txt`, as Ultralytics does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from detrkit.datasets import segments
from detrkit.datasets.detection import (
    DetectionDataset,
    ImageRecord,
    SampleTransform,
    header_size,
)
from detrkit.datasets.image_check import ImageScreen
from detrkit.datasets.keypoint_schema import KeypointSchema
from detrkit.datasets.yolo_pose import (
    PoseFormat,
    fit_width,
    pose_row,
    pose_schema,
    read_pose_format,
)

YAML_FILES = ("data.yaml", "data.yml")
IMAGE_EXTENSIONS = frozenset({".bmp", ".dng", ".jpg", ".jpeg", ".mpo", ".png", ".tif", ".tiff", ".webp"})
# split -> data.yaml keys that declare it, in the order they are read
SPLIT_KEYS = {"train": ("train",), "valid": ("val", "valid"), "test": ("test",)}
# split -> image folders tried (below the base) when data.yaml declares none
CONVENTIONS = {"train": ("train/images", "images/train"),
               "valid": ("valid/images", "val/images", "images/val", "images/valid"),
               "test": ("test/images", "images/test")}


@dataclass
class YoloConfig:
    """What a data.yaml says: its class names, the folder relative entries start from, the
    entries (folders or list files) declared for each split that declares any, and the keypoint
    format of a pose data set (None for others)."""

    file: Path
    names: list[str]
    base: Path
    entries: dict[str, list[str]]
    pose: PoseFormat | None = None


@dataclass
class LabelRows:
    """The kept rows of one label file: boxes (N, 4) xyxy normalised and clamped, labels (N,),
    polygons (N of (n, 2) normalised x, y; a box line's four corners) and their line numbers;
    `dropped` counts the degenerate boxes left out. Pose lines add keypoints (N of (K, 3))."""

    boxes: np.ndarray
    labels: np.ndarray
    polygons: list[np.ndarray]
    lines: list[int]
    dropped: int
    keypoints: list[np.ndarray] | None = None


class YoloDetection(DetectionDataset):
    """The given images with their YOLO label files; an image without a label file is background.
    Image ids count the images in the order given. With `masks`, each row's mask is its polygon
    filled (a box line's, its box), checked against the image size and kept as compressed RLE.
    A pose data set (`pose`) has pose lines; with a `keypoint_schema` their keypoints are kept."""

    def __init__(self, images: list[Path], class_names: list[str], transform: SampleTransform,
                 masks: bool = False, pose: PoseFormat | None = None,
                 keypoint_schema: KeypointSchema | None = None) -> None:
        records, degenerate, labelled, empty, total = [], {}, 0, 0, 0
        for image_id, image in enumerate(images):
            label_file = label_path(image)
            labelled += label_file.is_file()
            size = header_size(image) if masks and label_file.is_file() else None
            rows = read_label_file(label_file, len(class_names), size, pose)
            if rows.dropped:
                degenerate[label_file] = rows.dropped
            record = ImageRecord(path=image, image_id=image_id, boxes=rows.boxes, labels=rows.labels,
                                 iscrowd=np.zeros(len(rows.labels), dtype=bool), size=size)
            if keypoint_schema is not None:
                record.keypoints = fit_width(rows.keypoints or [], keypoint_schema.width)
            if masks:
                record.mask_rles = _mask_rles(rows, label_file, size)
                empty += int((segments.mask_areas(record.mask_rles, size) == 0).sum()) if size else 0
                total += len(record.mask_rles)
            records.append(record)
        _warn_labels(images, degenerate, labelled)
        if masks:
            segments.warn_empty(empty, total, f"the label files of {len(images)} images")
        super().__init__(records, class_names, transform, keypoint_schema=keypoint_schema)


def _mask_rles(rows: LabelRows, label_file: Path, size: tuple[int, int] | None) -> list[bytes]:
    if size is None:  # no label file: a background image
        return []
    height, width = size
    return [segments.encode_polygons([polygon * (width, height)], size, f"label file {label_file} line {line}")
            for polygon, line in zip(rows.polygons, rows.lines)]


def _warn_labels(images: list[Path], degenerate: dict[Path, int], labelled: int) -> None:
    if degenerate:
        files = ", ".join(str(file) for file in list(degenerate)[:3]) + (" ..." if len(degenerate) > 3 else "")
        warnings.warn(f"dropped {sum(degenerate.values())} degenerate boxes (width or height <= 0 after "
                      f"clamping to the image) in {files}", stacklevel=3)
    if images and not labelled:
        warnings.warn(f"none of the {len(images)} images has a label file (looked for "
                      f"{label_path(images[0])} and the like); all are background", stacklevel=3)


def label_path(image: Path) -> Path:
    """The label file of an image: rightmost `images` folder swapped for `labels`, suffix `.txt`;
    beside the image when no folder of its path is called `images`."""
    folders = image.parts[:-1]
    for index in range(len(folders) - 1, -1, -1):
        if folders[index] == "images":
            return Path(*folders[:index], "labels", *folders[index + 1:], image.name).with_suffix(".txt")
    return image.with_suffix(".txt")


def find_yaml(root: Path) -> Path | None:
    return next((root / name for name in YAML_FILES if (root / name).is_file()), None)


def read_yolo_config(path: Path) -> YoloConfig:
    """Parse and check a data.yaml: `names` (list or index dict), `nc`, `path` and the split keys."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"invalid YAML in {path}: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping with a 'names' entry, got {type(data).__name__}")
    names = _class_names(data.get("names"), path)
    count = data.get("nc")
    if count is not None and count != len(names):
        raise ValueError(f"{path}: nc is {count} but 'names' lists {len(names)} classes")
    entries = {}
    for split, keys in SPLIT_KEYS.items():
        key = next((key for key in keys if data.get(key) is not None), None)
        if key is not None:
            entries[split] = _split_entries(data[key], key, path)
    return YoloConfig(path, names, _base_folder(data.get("path"), path), entries,
                      read_pose_format(data, path, len(names)))


def _class_names(names: object, path: Path) -> list[str]:
    """`names` as a list, or as a dict {index: name} whose indices are 0..N-1."""
    if isinstance(names, dict):
        # YAML reads `0: cat` as an int key and `"0": cat` as a str one; take both
        indices = {int(key) if str(key).isascii() and str(key).isdigit() else key: name
                   for key, name in names.items()}
        if set(indices) != set(range(len(names))):
            raise ValueError(f"{path}: 'names' keys must be the indices 0..{len(names) - 1}, got {list(names)}")
        names = [indices[index] for index in range(len(names))]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path} needs a 'names' entry: a list of class names or a dict "
                         f"{{index: name}}, got {names!r}")
    return [str(name) for name in names]


def _split_entries(value: object, key: str, path: Path) -> list[str]:
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(entry, str) and entry.strip() for entry in entries):
        raise ValueError(f"{path}: '{key}' must be a folder or list file path, or a list of them, got {value!r}")
    return [entry.strip() for entry in entries]


def _base_folder(declared: object, path: Path) -> Path:
    """`path:` (relative to the YAML's folder when relative), or the YAML's folder when absent;
    a `path:` that is not a folder (a data set moved since) falls back to the YAML's folder."""
    if declared is None or declared == "":
        return path.parent
    base = Path(str(declared)).expanduser()
    base = base if base.is_absolute() else path.parent / base
    if base.is_dir():
        return base
    warnings.warn(f"{path}: path {declared!r} ({base}) is not a folder; resolving the splits "
                  f"against {path.parent} instead", stacklevel=3)
    return path.parent


def split_images(config: YoloConfig, split: str) -> list[Path] | None:
    """The sorted images of a split: from its data.yaml entries, else from the first existing
    convention folder; None when neither gives any."""
    if split not in config.entries:
        folder = next((config.base / f for f in CONVENTIONS[split] if (config.base / f).is_dir()), None)
        return None if folder is None else _folder_images(folder, f"{split} folder {folder}")
    images = []
    for entry in config.entries[split]:
        images += _entry_images(config, split, entry)
    return sorted(images, key=str)


def _entry_images(config: YoloConfig, split: str, entry: str) -> list[Path]:
    where = f"{config.file}: {split} entry {entry!r}"
    path = _resolve(config.base, entry)
    if path.is_dir():
        return _folder_images(path, f"{where} (folder {path})")
    if path.is_file():
        return _listed_images(path, config.base, where)
    raise FileNotFoundError(f"{where} resolves to {path}, which does not exist")


def _resolve(base: Path, entry: str) -> Path:
    """An entry relative to the base; a leading '../' that leads nowhere is dropped, as Ultralytics
    does for Roboflow exports ('train: ../train/images' beside the train folder)."""
    path = Path(entry).expanduser()
    if path.is_absolute():
        return path
    if not (base / path).exists() and entry.startswith("../"):
        retry = base / entry[3:]
        if retry.exists():
            return retry
    return base / path


def _folder_images(folder: Path, where: str) -> list[Path]:
    """The images anywhere below a folder, symlinked folders followed, in path order."""
    images, seen = [], set()
    for current, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:  # a symlink loop: stop descending
            folders.clear()
            continue
        seen.add(real)
        images += [Path(current) / name for name in files if Path(name).suffix.lower() in IMAGE_EXTENSIONS]
    if not images:
        raise FileNotFoundError(f"{where} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    return sorted(images, key=str)


def _listed_images(list_file: Path, base: Path, where: str) -> list[Path]:
    """The images a list file names, one a line: absolute, './'-relative to the list file's
    folder (as Ultralytics writes them) or relative to the base."""
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: list file {list_file} is not UTF-8 text: {error}") from error
    images = []
    for number, line in enumerate(lines, start=1):
        entry = line.strip()
        if not entry:
            continue
        image = list_file.parent / entry[2:] if entry.startswith("./") else _resolve(base, entry)
        if not image.is_file():
            raise FileNotFoundError(f"{where}: {list_file} line {number} names {image}, which does not exist")
        if image.suffix.lower() not in IMAGE_EXTENSIONS:
            raise ValueError(f"{where}: {list_file} line {number} names {image}, which is not an image "
                             f"({', '.join(sorted(IMAGE_EXTENSIONS))})")
        images.append(image)
    if not images:
        raise FileNotFoundError(f"{where}: list file {list_file} names no images")
    return images


def read_label_file(path: Path, num_classes: int, size: tuple[int, int] | None = None,
                    pose: PoseFormat | None = None) -> LabelRows:
    """The rows of lines `cls cx cy w h` or `cls x1 y1 ... xn yn` (box = polygon bounds), or of
    pose lines when `pose` is given. Given the image size (H, W), a polygon more than a pixel
    outside the image is an error."""
    boxes, labels, polygons, numbers, degenerate = [], [], [], [], 0
    keypoints = [] if pose is not None else None
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except UnicodeDecodeError as error:
        raise ValueError(f"label file {path} is not UTF-8 text: {error}") from error
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        label, box, points, row_keypoints = _parse_line(line, path, number, num_classes, pose)
        if size is not None:
            _check_inside(points, size, path, number)
        box = np.clip(box, 0.0, 1.0)
        if box[2] <= box[0] or box[3] <= box[1]:
            degenerate += 1
            continue
        boxes.append(box)
        labels.append(label)
        polygons.append(points)
        numbers.append(number)
        if keypoints is not None:
            keypoints.append(row_keypoints)
    return LabelRows(np.array(boxes, dtype=np.float32).reshape(-1, 4), np.array(labels, dtype=np.int64),
                     polygons, numbers, degenerate, keypoints)


def _check_inside(points: np.ndarray, size: tuple[int, int], path: Path, number: int) -> None:
    height, width = size
    slack = segments.BORDER_SLACK / np.array([width, height])
    if (points < -slack).any() or (points > 1 + slack).any():
        low, high = points.min(axis=0), points.max(axis=0)
        raise ValueError(f"label file {path} line {number}: the polygon spans x {low[0]:g}..{high[0]:g}, "
                         f"y {low[1]:g}..{high[1]:g} (normalised), outside the {width}x{height} image by more "
                         f"than {segments.BORDER_SLACK:g} pixel")


def _parse_line(line: str, path: Path, number: int, num_classes: int,
                pose: PoseFormat | None) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
    """(class, box xyxy, (n, 2) vertices, (K, 3) keypoints of a pose line or None), all normalised;
    a box or pose line's vertices are its box's corners."""
    fields = line.split()
    try:
        values = [float(field) for field in fields]
    except ValueError as error:
        raise ValueError(f"{path} line {number}: {error} in {line!r}") from error
    if not np.isfinite(values).all():
        raise ValueError(f"{path} line {number}: non-finite value in {line!r}")
    if pose is None and len(values) != 5 and (len(values) < 7 or len(values) % 2 == 0):
        raise ValueError(f"{path} line {number}: expected 'cls cx cy w h' or 'cls x1 y1 ... xn yn' "
                         f"(n >= 3), got {len(values)} values")
    label = values[0]
    if label != int(label) or not 0 <= label < num_classes:
        raise ValueError(f"{path} line {number}: class {fields[0]} is not one of the "
                         f"{num_classes} class indices 0..{num_classes - 1}")
    keypoints = None
    if pose is not None:
        box, keypoints = pose_row(values, pose, path, number)
    elif len(values) == 5:
        cx, cy, w, h = values[1:]
        box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    else:
        points = np.array(values[1:]).reshape(-1, 2)
        return int(label), np.concatenate([points.min(axis=0), points.max(axis=0)]), points, None
    x0, y0, x1, y1 = box
    return int(label), box, np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]]), keypoints


def yolo_splits(root: Path, train_transform: SampleTransform, eval_transform: SampleTransform,
                masks: bool = False, keypoints: Sequence[int] | None = None, screen: ImageScreen | None = None,
                ) -> tuple[YoloDetection, YoloDetection, YoloDetection | None]:
    """train and valid are required, test is optional. Every split's images are found (and
    every declared entry checked) before any label file is read. `keypoints` (the model's
    num_keypoints_per_class; empty: as data.yaml says) reads a pose data set's keypoints. A
    `screen` checks every split's images (cached beside data.yaml) and the bad ones are left out."""
    yaml_file = find_yaml(root)
    if yaml_file is None:
        raise FileNotFoundError(f"no {' or '.join(YAML_FILES)} in YOLO data set {root}")
    config = read_yolo_config(yaml_file)
    schema = None
    if keypoints is not None:
        if config.pose is None:
            raise ValueError(f"{yaml_file} has no kpt_shape, so it is not a YOLO pose data set, but keypoints "
                             f"were asked for (a keypoint model)")
        schema = pose_schema(config.pose, len(config.names), keypoints, yaml_file)
    images = {split: _required_split(config, split) for split in ("train", "valid")}
    images["test"] = _optional_split(config)
    if screen is not None:
        for name, listed in images.items():
            if listed:
                bad = screen(yaml_file.parent, name, [(image, None) for image in listed])
                images[name] = [image for image in listed if image not in bad]

    def split(name: str, transform: SampleTransform) -> YoloDetection:
        return YoloDetection(images[name], config.names, transform, masks, config.pose, schema)

    return split("train", train_transform), split("valid", eval_transform), \
        split("test", eval_transform) if images["test"] else None


def _required_split(config: YoloConfig, split: str) -> list[Path]:
    images = split_images(config, split)
    if images is None:
        looked = " or ".join(str(config.base / folder) for folder in CONVENTIONS[split])
        keys = " or ".join(f"'{key}:'" for key in SPLIT_KEYS[split])
        raise FileNotFoundError(f"YOLO data set {config.file.parent} has no {split} split: {config.file} "
                                f"declares no {keys} and none of {looked} exists")
    return images


def _optional_split(config: YoloConfig) -> list[Path] | None:
    """The test split; one declared but missing (Roboflow writes 'test:' even without a test
    folder) is skipped with a warning rather than failing training."""
    try:
        return split_images(config, "test")
    except FileNotFoundError as error:
        warnings.warn(f"skipping the test split: {error}", stacklevel=3)
        return None
