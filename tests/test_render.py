"""Pictures for people: ground truth and predictions in distinct styles, labels readable on any background."""

from __future__ import annotations

import json

import numpy as np
import supervision as sv
from PIL import Image

from detrkit import demo
from detrkit.render import _PALETTE, draw_detections, draw_ground_truth


def detections(class_id: int, score: float = 0.9) -> sv.Detections:
    return sv.Detections(xyxy=np.array([[20.0, 40.0, 80.0, 90.0]]), confidence=np.array([score]),
                         class_id=np.array([class_id]), data={"class_name": np.array(["thing"])})


def test_ground_truth_is_dashed_white_over_black_on_any_background():
    for grey in (0, 128, 255):
        drawn = np.asarray(draw_ground_truth(Image.new("RGB", (100, 100), (grey,) * 3), np.array([[20, 30, 70, 80]])))
        edge = drawn[30, 20:71]  # the top edge
        assert (edge == 0).all(axis=1).any() and (edge == 255).all(axis=1).any()  # black and white dashes
        assert (drawn[50:60, 40:50] == grey).all()  # the inside untouched


def test_labels_are_chips_with_contrasting_text():
    bright, dark = _PALETTE.index((255, 225, 25)), _PALETTE.index((0, 130, 200))
    for class_id, text in ((bright, 0), (dark, 255)):
        for background in (0, 255):
            drawn = np.asarray(draw_detections(Image.new("RGB", (120, 120), (background,) * 3), detections(class_id)))
            chip = drawn[29:39, 21:45].reshape(-1, 3).astype(int)  # inside the chip above the box's corner
            colour = np.array(_PALETTE[class_id])
            assert (chip == colour).all(axis=1).mean() > 0.3  # filled in the box's colour
            # text in black on bright chips, white on dark ones, whatever the image behind
            assert (np.abs(chip - text).max(axis=1) < 60).sum() >= 5


class FixedModel:
    """predict() as an RFDETR does, returning one detection and recording the threshold asked for."""

    def __init__(self) -> None:
        self.thresholds: list[float] = []

    def predict(self, image, threshold: float):
        self.thresholds.append(threshold)
        return detections(0, 0.8)


def test_demo_picture_draws_truth_and_predictions_above_the_threshold(tmp_path):
    folder = tmp_path / "valid"
    folder.mkdir()
    images, annotations = [], []
    for index in range(2):
        Image.new("RGB", (120, 100), (90, 90, 90)).save(folder / f"{index}.jpg")
        images.append({"id": index, "file_name": f"{index}.jpg", "width": 120, "height": 100})
        annotations.append({"id": index, "image_id": index, "category_id": 1, "bbox": [10, 10, 30, 30]})
    (folder / "_annotations.coco.json").write_text(json.dumps({"images": images, "annotations": annotations}))
    model = FixedModel()
    picture = demo._draw_predictions(model, sorted(folder.glob("*.jpg")), tmp_path)
    assert model.thresholds == [demo.DEMO_THRESHOLD] * 2
    drawn = np.asarray(Image.open(picture))
    assert drawn.shape[1] == 2 * 120 + 4 and drawn.shape[0] > 100  # two tiles, a gap, captions below
    top_edge = drawn[10, 10:41]
    assert (top_edge == 255).all(axis=1).any() and (top_edge == 0).all(axis=1).any()  # the dashed truth box


def test_labels_of_duplicate_boxes_are_stacked_not_overlapped():
    both = sv.Detections(xyxy=np.array([[20.0, 40.0, 80.0, 90.0]] * 2), confidence=np.array([0.5, 0.9]),
                         class_id=np.array([0, 3]), data={"class_name": np.array(["low", "high"])})
    drawn = np.asarray(draw_detections(Image.new("RGB", (120, 120), (255, 255, 255)), both))
    column = drawn[:, 22].astype(int)  # down through the chips, beside the box's left edge
    rows_of = {name: np.flatnonzero((column == np.array(_PALETTE[i])).all(axis=1)) for name, i in (("high", 3), ("low", 0))}
    assert rows_of["high"].size and rows_of["low"].size
    assert rows_of["high"].max() < rows_of["low"].min()  # the higher score's chip first, the other below it
