"""compute_train_metrics: training batches scored against their own augmented targets."""

from types import SimpleNamespace

import pytest
import torch

from detrkit.structures import Batch, Target
from detrkit.training.train_metrics import TrainingSetMetrics


def batch_of(boxes: torch.Tensor, labels: torch.Tensor) -> Batch:
    # the transformed image is 50 high, 100 wide; orig_size differs, as after a resize or crop
    target = Target(boxes, labels, image_id=3, orig_size=(500, 1000), size=(50, 100))
    return Batch(pixels=torch.zeros(1, 3, 64, 128), padding=None, targets=[target])


def outputs_for(boxes: torch.Tensor, labels: torch.Tensor, groups: int, num_queries: int, classes: int = 3):
    """Query group 0 predicts `boxes` with confidence; the other groups predict garbage."""
    logits = torch.full((1, groups * num_queries, classes), -9.0)
    pred = torch.full((1, groups * num_queries, 4), 0.5)
    logits[0, num_queries:] = 9.0  # confident garbage in the other groups: must be ignored
    pred[0, num_queries:] = torch.tensor([0.1, 0.9, 0.05, 0.05])
    logits[0, torch.arange(len(labels)), labels] = 5.0
    pred[0, :len(boxes)] = boxes
    return SimpleNamespace(pred_logits=logits, pred_boxes=pred)


@pytest.mark.parametrize("shift, expected_map_50", [(0.0, 1.0), (0.3, 0.0)])
def test_first_query_group_is_scored_in_the_transformed_images_pixels(shift, expected_map_50):
    truth = torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.2, 0.2]])
    labels = torch.tensor([0, 2])
    metrics = TrainingSetMetrics(max_dets=100, backend="vernier", num_queries=10, num_select=10)
    predicted = truth + torch.tensor([shift, 0.0, 0.0, 0.0])
    metrics.add(outputs_for(predicted, labels, groups=3, num_queries=10), batch_of(truth, labels))
    evaluator = metrics.take()
    assert len(evaluator) == 1
    scored = evaluator.detections[0]
    assert len(scored["scores"]) == 10  # num_select of group 0's queries only
    # boxes in the transformed image's pixels: cx 0.3 * 100, w 0.2 * 100, cy 0.4 * 50, h 0.3 * 50
    if shift == 0.0:
        assert scored["boxes"][0].tolist() == pytest.approx([20.0, 12.5, 40.0, 27.5])
    values = evaluator.compute()
    assert values["mAP_50"] == pytest.approx(expected_map_50)
    assert len(metrics.take()) == 0  # the next epoch starts empty
