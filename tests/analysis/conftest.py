"""A tiny detector fitted to tiny synthetic shapes (so its metrics are far from 0), then run
through a short train(), and that run's files."""

import pytest
import torch
from tiny_config import TINY

from detrkit import RFDETRNano
from detrkit.config import TrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.losses.criterion import build_criterion
from detrkit.training import RFDETRDataModule

FAST = {"epochs": 1, "batch_size": 2, "num_workers": 0, "progress_bar": None, "tensorboard": False, "seed": 0,
        "use_ema": False, "lr": 1e-6, "lr_encoder": 1e-6}


@pytest.fixture(scope="package")
def shapes_dir(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=4,
                                  num_test=2, image_size=(96, 64), seed=0, max_objects=3)


def fit_to_validation(model: RFDETRNano, dataset_dir, steps: int = 60) -> None:
    """Fit the network to the validation images as validation sees them."""
    config = TrainConfig(dataset_dir=str(dataset_dir), batch_size=4, num_workers=0, progress_bar=None)
    model._fit_classes(RFDETRDataModule(model.model_config, config).class_names)
    batch = next(iter(RFDETRDataModule(model.model_config, config).val_dataloader()))
    criterion = build_criterion(model.model_config, config)
    network = model.model.train()
    optimizer = torch.optim.AdamW(network.parameters(), lr=2e-3)
    for _ in range(steps):
        loss = criterion(network(batch.pixels, batch.padding), batch.targets, groups=network.groups).total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    network.eval()


@pytest.fixture(scope="package")
def trained(shapes_dir, tmp_path_factory):
    """(model, output_dir) after train(), which drew its plots (evaluation_plots defaults to True)."""
    torch.manual_seed(0)
    output = tmp_path_factory.mktemp("run")
    model = RFDETRNano(**TINY)
    fit_to_validation(model, shapes_dir)
    model.train(dataset_dir=str(shapes_dir), output_dir=str(output), **FAST)
    return model, output


@pytest.fixture
def fitting():
    """(fit_to_validation, the short train() settings) for a test's own run."""
    return fit_to_validation, dict(FAST)
