"""Masks and keypoints in the validation galleries, drawn where they are on tiny known cases."""

import matplotlib.pyplot as plt
import numpy as np
import torch
from canvas_pixels import canvas, pixel, rendered, tinted
from matplotlib.colors import to_rgb

from detrkit.analysis.gallery import FALSE_POSITIVE, TRUE_POSITIVE, TRUTH, draw_predictions, draw_truth, image_outcome
from detrkit.training.coco_backends.rle import EncodedMasks

A = [0.0, 0.0, 20.0, 40.0]  # the image's left half


def mask_case():
    """A 40x40 image: ground truth the left half (class 0); detections on it (right) and on the
    right half (false positive), each with its mask filling its box."""
    left, right = torch.zeros((40, 40), dtype=torch.bool), torch.zeros((40, 40), dtype=torch.bool)
    left[:, :20], right[:, 20:] = True, True
    truth = {"boxes": torch.tensor([A]), "labels": torch.tensor([0]), "iscrowd": torch.tensor([0]),
             "masks": EncodedMasks.encode(left[None])}
    detection = {"boxes": torch.tensor([A, [20.0, 0.0, 40.0, 40.0]]), "scores": torch.tensor([0.9, 0.8]),
                 "labels": torch.tensor([0, 0]), "masks": EncodedMasks.encode(torch.stack([left, right]))}
    return detection, truth


def test_gallery_tints_ground_truth_and_predicted_masks_where_they_are():
    detection, truth = mask_case()
    outcome = image_outcome(detection, truth, threshold=0.5)
    figure, axis = canvas(40, 40)
    axis.imshow(np.zeros((40, 40, 3), np.uint8), extent=(0, 40, 40, 0))
    draw_truth(axis, truth, outcome, ["thing"], [])
    pixels = rendered(figure)
    np.testing.assert_allclose(pixel(pixels, 10, 20), tinted(TRUTH), atol=0.02)
    np.testing.assert_allclose(pixel(pixels, 30, 20), 0, atol=0.02)
    figure, axis = canvas(40, 40)
    axis.imshow(np.zeros((40, 40, 3), np.uint8), extent=(0, 40, 40, 0))
    draw_predictions(axis, detection, outcome, ["thing"], [])
    pixels = rendered(figure)
    np.testing.assert_allclose(pixel(pixels, 10, 20), tinted(TRUE_POSITIVE), atol=0.02)
    np.testing.assert_allclose(pixel(pixels, 30, 20), tinted(FALSE_POSITIVE), atol=0.02)
    low = image_outcome(detection, truth, threshold=0.85)  # the false positive is not kept: not drawn
    figure, axis = canvas(40, 40)
    axis.imshow(np.zeros((40, 40, 3), np.uint8), extent=(0, 40, 40, 0))
    draw_predictions(axis, detection, low, ["thing"], [])
    np.testing.assert_allclose(pixel(rendered(figure), 30, 20), 0, atol=0.02)


def test_gallery_draws_keypoints_at_their_positions_with_the_skeleton():
    truth = {"boxes": torch.tensor([A]), "labels": torch.tensor([0]), "iscrowd": torch.tensor([0]),
             "keypoints": torch.tensor([[[5.0, 5.0, 2.0], [15.0, 5.0, 1.0], [15.0, 35.0, 0.0]]])}
    detection = {"boxes": torch.tensor([A]), "scores": torch.tensor([0.9]), "labels": torch.tensor([0]),
                 "keypoints": torch.tensor([[[6.0, 4.0, 0.9], [14.0, 6.0, 0.7], [15.0, 30.0, 0.2]]])}
    outcome = image_outcome(detection, truth, threshold=0.5)
    edges = [[(0, 1), (1, 2)]]
    figure, axis = plt.subplots()
    draw_truth(axis, truth, outcome, ["thing"], edges)
    lines, solid, ring = axis.collections
    np.testing.assert_allclose(solid.get_offsets(), [[5, 5]])
    np.testing.assert_allclose(ring.get_offsets(), [[15, 5]])
    np.testing.assert_allclose(lines.get_segments(), [[[5, 5], [15, 5]]])  # not to the unlabelled keypoint
    plt.close(figure)
    figure, axis = plt.subplots()
    draw_predictions(axis, detection, outcome, ["thing"], edges)
    lines, solid, ring = axis.collections
    np.testing.assert_allclose(solid.get_offsets(), [[6, 4], [14, 6]])  # found with probability >= 0.5
    assert len(ring.get_offsets()) == 0
    np.testing.assert_allclose(lines.get_segments(), [[[6, 4], [14, 6]]])
    assert np.allclose(solid.get_facecolor()[0][:3], to_rgb(TRUE_POSITIVE))
    plt.close(figure)


def test_mask_overlay_stretches_head_resolution_masks_over_the_image():
    """Masks at the mask head's resolution (eval_masks_head_resolution) cover the whole image."""
    detection, truth = mask_case()
    small = torch.zeros((1, 10, 10), dtype=torch.bool)
    small[0, :, :5] = True
    truth["masks"] = EncodedMasks.encode(small)
    figure, axis = canvas(40, 40)
    axis.imshow(np.zeros((40, 40, 3), np.uint8), extent=(0, 40, 40, 0))
    draw_truth(axis, truth, image_outcome(detection, truth, 0.5), ["thing"], [])
    pixels = rendered(figure)
    np.testing.assert_allclose(pixel(pixels, 10, 30), tinted(TRUTH), atol=0.02)
    np.testing.assert_allclose(pixel(pixels, 30, 30), 0, atol=0.02)


def test_large_masks_are_subsampled_in_place():
    """Masks over 400 px a side are drawn subsampled, still where they are."""
    from detrkit.analysis.drawing import overlay_masks

    masks = np.zeros((1, 900, 900), dtype=bool)
    masks[0, 300:600, :450] = True
    figure = plt.figure(figsize=(9, 9), dpi=100)  # one rendered pixel per image pixel
    axis = figure.add_axes((0, 0, 1, 1))
    axis.imshow(np.zeros((900, 900, 3), np.uint8), extent=(0, 900, 900, 0))
    overlay_masks(axis, masks, [TRUTH], (900, 900))
    assert axis.get_images()[1].get_array().shape[:2] == (300, 300)  # every third pixel
    pixels = rendered(figure)
    np.testing.assert_allclose(pixels[450, 200], tinted(TRUTH), atol=0.02)
    np.testing.assert_allclose(pixels[450, 700], 0, atol=0.02)
    np.testing.assert_allclose(pixels[150, 200], 0, atol=0.02)


def test_only_the_best_scored_predictions_are_drawn():
    """An undertrained model keeps many detections: MAX_DRAWN of them are drawn, the best scored,
    and only their masks are decoded and tinted."""
    from matplotlib.patches import Rectangle

    from detrkit.analysis.gallery import MAX_DRAWN

    count = MAX_DRAWN + 15
    scores = torch.linspace(0.99, 0.6, count)[torch.randperm(count, generator=torch.Generator().manual_seed(0))]
    boxes = torch.tensor([[float(i), 0.0, float(i) + 1, 1.0] for i in range(count)])  # one column each
    masks = torch.zeros((count, 4, count), dtype=torch.bool)
    for i in range(count):
        masks[i, :, i] = True
    detection = {"boxes": boxes, "scores": scores, "labels": torch.zeros(count, dtype=torch.long),
                 "masks": EncodedMasks.encode(masks)}
    truth = {"boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.long)}
    outcome = image_outcome(detection, truth, threshold=0.5)
    assert len(outcome.kept) == count
    figure, axis = canvas(4, count)
    axis.imshow(np.zeros((4, count, 3), np.uint8), extent=(0, count, 4, 0))
    assert draw_predictions(axis, detection, outcome, ["thing"], []) == MAX_DRAWN
    drawn = sorted(int(patch.get_x()) for patch in axis.patches if isinstance(patch, Rectangle))
    best = sorted(scores.argsort(descending=True)[:MAX_DRAWN].tolist())
    assert drawn == best
    pixels = rendered(figure)
    worst = scores.argsort()[0].item()
    np.testing.assert_allclose(pixel(pixels, best[0] + 0.5, 3.5), tinted(FALSE_POSITIVE), atol=0.02)
    np.testing.assert_allclose(pixel(pixels, worst + 0.5, 3.5), 0, atol=0.02)
