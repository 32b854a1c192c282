"""Each plot's data on known tiny cases, and each PNG written (after train(), from evaluate(), from a result)."""

import numpy as np
import pytest
import torch
from PIL import Image

from detrkit.analysis.confusion import confusion_matrix, normalised
from detrkit.analysis.curves import precision_recall_curves
from detrkit.analysis.evaluate import analyse
from detrkit.analysis.gallery import image_outcome, worst_images
from detrkit.analysis.report import write_plots

PLOTS = {"confusion_matrix.png", "pr_curves.png", "confidence_curves.png", "tide.png", "gallery.png",
         "worst_images.png"}
A, B, C = [0.0, 0.0, 20.0, 20.0], [40.0, 40.0, 60.0, 70.0], [80.0, 0.0, 95.0, 15.0]


def tiny_case():
    """Image 0: boxes A (class 0) and B (class 1); detections on A as 0 (right), on B as 0 (confused),
    on empty C as 1 (background), and on A as 1 below the threshold. Image 1: a class 0 box, no detections."""
    detections = [{"boxes": torch.tensor([A, B, C, A]), "scores": torch.tensor([0.9, 0.8, 0.7, 0.1]),
                   "labels": torch.tensor([0, 0, 1, 1])},
                  {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}]
    truth = [{"boxes": torch.tensor([A, B]), "labels": torch.tensor([0, 1]), "iscrowd": torch.tensor([0, 0])},
             {"boxes": torch.tensor([B]), "labels": torch.tensor([0]), "iscrowd": torch.tensor([0])}]
    return detections, truth


def test_confusion_matrix_of_a_known_case():
    detections, truth = tiny_case()
    matrix = confusion_matrix(detections, truth, num_classes=2, threshold=0.5)
    expected = np.array([[1, 0, 1],   # class 0: one found, one missed (image 1)
                         [1, 0, 0],   # class 1: taken for class 0
                         [0, 1, 0]])  # background: one false class 1
    np.testing.assert_array_equal(matrix, expected)
    np.testing.assert_allclose(normalised(matrix), [[0.5, 0, 0.5], [1, 0, 0], [0, 1, 0]])
    low = confusion_matrix(detections, truth, num_classes=2, threshold=0.05)  # the 0.1 detection: A is taken, so background
    assert low[2, 1] == 2 and low.sum() == matrix.sum() + 1


def test_precision_recall_curve_and_its_ap():
    detections, truth = tiny_case()
    curves = {curve.label: curve for curve in precision_recall_curves(detections, truth)}
    zero = curves[0]  # class 0: 2 boxes; detections 0.9 right, 0.8 wrong
    np.testing.assert_allclose(zero.recall, [0.5, 0.5])
    np.testing.assert_allclose(zero.precision, [1.0, 0.5])
    assert zero.ap == pytest.approx(51 / 101)  # precision 1 up to recall 0.5, nothing beyond
    assert curves[1].ap == 0.0 and len(curves[1].recall) == 2


def test_image_outcomes_and_worst_images():
    detections, truth = tiny_case()
    outcome = image_outcome(detections[0], truth[0], threshold=0.5)
    np.testing.assert_array_equal(outcome.kept, [0, 1, 2])
    np.testing.assert_array_equal(outcome.true_positive, [True, False, False])
    np.testing.assert_array_equal(outcome.missed, [False, True])
    assert outcome.errors == 3
    assert worst_images(detections, truth, 0.5, 5) == [0, 1]
    assert worst_images(detections, truth, 0.5, 1) == [0]


def is_drawn_png(path):
    image = Image.open(path)
    pixels = np.asarray(image.convert("L"), dtype=np.float64)
    return image.format == "PNG" and image.width > 200 and pixels.std() > 5  # not blank


def test_write_plots_from_a_result(tmp_path):
    detections, truth = tiny_case()
    paths = []
    for index in range(2):
        paths.append(tmp_path / f"image{index}.png")
        Image.fromarray(np.full((80, 100, 3), 60 + 80 * index, dtype=np.uint8)).save(paths[-1])
    result = analyse(detections, truth, ["cat", "dog"], "valid", {}, [], 100, "vernier")
    result = write_plots(result.__class__(**{**result.__dict__, "image_paths": paths}), tmp_path / "plots", 0.5)
    assert {path.name for path in result.plots} == PLOTS
    assert all(is_drawn_png(path) for path in result.plots)


def test_plots_after_train_and_from_evaluate(trained, shapes_dir):
    model, output = trained
    # written by train(), with the run's results.png and its first two (augmented) training batches
    assert {path.name for path in (output / "plots").glob("*.png")} == PLOTS | {"results.png", "train_batch0.png",
                                                                                "train_batch1.png"}
    assert is_drawn_png(output / "plots" / "train_batch0.png")
    result = model.evaluate(shapes_dir, num_workers=0, output_dir=str(output / "eval"), threshold=0.3)
    assert sorted(result.plots) == sorted((output / "eval" / "plots").glob("*.png"))
    assert {path.name for path in result.plots} == PLOTS and all(is_drawn_png(path) for path in result.plots)


def test_precision_recall_plot_draws_a_class_without_detections(tmp_path):
    from detrkit.analysis.curves import PrecisionRecall
    from detrkit.analysis.plots import plot_precision_recall

    curves = [PrecisionRecall(0, np.array([0.5, 1.0]), np.array([1.0, 0.5]), 0.75),
              PrecisionRecall(1, np.zeros(0), np.zeros(0), 0.0)]  # a class the model never predicted
    path = plot_precision_recall(curves, ["a", "b"], tmp_path / "pr.png")
    assert is_drawn_png(path)
