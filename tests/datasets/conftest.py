"""Fixtures: tiny hand-written Roboflow-COCO and YOLO folders in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_data import annotation, coco_file, write_image


@pytest.fixture
def roboflow_dir(tmp_path: Path) -> Path:
    """train: one image with a cat box [20, 10, 60, 40] and a crowd dog; valid: one dog."""
    root = tmp_path / "roboflow"
    coco_file(root / "train", [annotation(0, [20, 10, 60, 40]),
                                   annotation(1, [100, 50, 50, 30], category_id=2, iscrowd=1)])
    coco_file(root / "valid", [annotation(0, [0, 0, 10, 10], category_id=2)])
    return root


@pytest.fixture
def yolo_dir(tmp_path: Path) -> Path:
    """data.yaml names [cat, dog]; train: a.png 100x50 with a box and a polygon, b.png background."""
    root = tmp_path / "yolo"
    for split in ("train", "valid"):
        write_image(root / split / "images" / "a.png", 100, 50)
        write_image(root / split / "images" / "b.png", 100, 50, seed=1)
        (root / split / "labels").mkdir()
        (root / split / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n1 0.1 0.2 0.3 0.2 0.2 0.6\n")
    (root / "data.yaml").write_text("names: [cat, dog]\nnc: 2\n")
    return root
