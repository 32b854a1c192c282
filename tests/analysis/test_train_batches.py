"""The first training batches as drawn: boxes from the batch's targets, un-normalised pixels,
masks and keypoints, written on the first two steps of a fresh run only."""

from types import SimpleNamespace

import numpy as np
import torch
from canvas_pixels import canvas, pixel, rendered, tinted
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.patches import Rectangle

from detrkit.analysis.drawing import class_colour
from detrkit.analysis.train_batches import TrainBatchPlots, batch_images, draw_sample, pixel_target
from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD
from detrkit.structures import Batch, Target


def known_target(**extra) -> Target:
    """One square (class 1) in a 40 high, 80 wide image: cx 0.5, cy 0.5, w 0.5, h 0.25 -> xyxy (20, 15, 60, 25)."""
    return Target(torch.tensor([[0.5, 0.5, 0.5, 0.25]]), torch.tensor([1]), image_id=7, orig_size=(40, 80),
                  size=(40, 80), **extra)


def test_pixel_target_scales_boxes_and_keypoints_by_the_transformed_size():
    keypoints = torch.tensor([[[0.25, 0.5, 2.0], [0.75, 0.25, 1.0], [0.0, 0.0, 0.0]]])
    drawn = pixel_target(known_target(keypoints=keypoints))
    np.testing.assert_allclose(drawn.boxes, [[20, 15, 60, 25]])
    np.testing.assert_allclose(drawn.keypoints, [[[20, 20, 2], [60, 10, 1], [0, 0, 0]]])


def test_batch_images_undo_the_normalisation():
    rgb = torch.randint(0, 256, (2, 3, 5, 6), dtype=torch.uint8)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    pixels = (rgb.float() / 255 - mean) / std
    np.testing.assert_array_equal(batch_images(pixels), rgb.permute(0, 2, 3, 1).numpy())
    grey = batch_images(pixels[:, :1])  # one channel is shown grey
    assert grey.shape == (2, 5, 6, 3) and (grey[..., 0] == grey[..., 2]).all()


def test_train_sample_draws_the_targets_boxes_names_masks_and_keypoints():
    masks = torch.zeros((1, 40, 80), dtype=torch.bool)
    masks[0, 15:25, 20:40] = True  # the square's left half
    keypoints = torch.tensor([[[0.25, 0.5, 2.0], [0.75, 0.5, 2.0], [0.5, 0.25, 1.0], [0.1, 0.1, 0.0]]])
    figure, axis = canvas(40, 80)
    draw_sample(axis, np.zeros((40, 80, 3), np.uint8), pixel_target(known_target(masks=masks, keypoints=keypoints)),
                ["circle", "square"], [[], [(0, 1), (1, 2), (2, 3)]])
    (box,) = [patch for patch in axis.patches if isinstance(patch, Rectangle)]
    assert (box.get_x(), box.get_y(), box.get_width(), box.get_height()) == (20, 15, 40, 10)
    assert [text.get_text() for text in axis.texts] == ["square"]
    (skeleton,) = [marks for marks in axis.collections if type(marks) is LineCollection]
    solid, ring = [marks for marks in axis.collections if isinstance(marks, PathCollection)]
    np.testing.assert_allclose(solid.get_offsets(), [[20, 20], [60, 20]])  # visible
    np.testing.assert_allclose(ring.get_offsets(), [[40, 10]])  # occluded; the unlabelled one is left out
    np.testing.assert_allclose(skeleton.get_segments(), [[[20, 20], [60, 20]], [[60, 20], [40, 10]]])
    pixels = rendered(figure)
    np.testing.assert_allclose(pixel(pixels, 30, 22), tinted(class_colour(1)), atol=0.02)  # inside the mask
    np.testing.assert_allclose(pixel(pixels, 50, 22), 0, atol=0.02)  # the box's other half: untouched
    np.testing.assert_allclose(pixel(pixels, 10, 35), 0, atol=0.02)


def fake_trainer(epoch: int, main: bool = True):
    return SimpleNamespace(current_epoch=epoch, is_global_zero=main)


def test_train_batches_are_drawn_on_the_first_two_steps_of_epoch_0_only(tmp_path):
    batch = Batch(torch.zeros((2, 3, 40, 80)), None, [known_target(), known_target()])
    callback = TrainBatchPlots(tmp_path, ["circle", "square"], None)
    for epoch, index, main in ((0, 0, False), (0, 0, True), (0, 1, True), (0, 2, True), (1, 0, True)):
        callback.on_train_batch_end(fake_trainer(epoch, main), None, None, batch, index)
    assert callback.written == [tmp_path / "train_batch0.png", tmp_path / "train_batch1.png"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train_batch0.png", "train_batch1.png"]
    resumed = TrainBatchPlots(tmp_path / "resumed", ["circle", "square"], None)
    resumed.on_train_batch_end(fake_trainer(3), None, None, batch, 0)  # a run resumed past epoch 0
    assert resumed.written == [] and not (tmp_path / "resumed").exists()


