"""Fixtures of the training tests: a tiny detector fitted to one image."""

import pytest
import torch
from tiny_config import TINY

from detrkit import RFDETRNano
from detrkit.config import TrainConfig
from detrkit.losses.criterion import build_criterion
from detrkit.structures import Target


@pytest.fixture(scope="module")
def fitted() -> tuple[RFDETRNano, torch.Tensor]:
    """A tiny CPU detector fitted to one image with two boxes (classes 1 and 3), so that its
    detections are decisive; and that image."""
    torch.manual_seed(0)
    detector = RFDETRNano(**TINY)
    image = torch.zeros(3, 64, 64)
    image[0, 8:30, 10:40] = image[2, 36:60, 30:50] = 1
    target = Target(torch.tensor([[25, 19, 30, 22], [40, 48, 20, 24]]) / 64, torch.tensor([1, 3]), 0, (64, 64),
                    (64, 64))
    criterion = build_criterion(detector.model_config, TrainConfig(dataset_dir=None))
    network, pixels = detector.model.train(), detector._preparer(None)([image])
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    for _ in range(120):
        loss = criterion(network(pixels), [target], groups=network.groups).total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    network.eval()
    return detector, image
