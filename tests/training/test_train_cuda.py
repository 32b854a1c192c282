"""train() on CUDA: loader workers with pinned memory, logs, weights that load and predict on the CPU, resume."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detrkit import RFDETRNano, from_checkpoint
from detrkit.datasets.synthetic import make_synthetic_dataset

pytestmark = pytest.mark.gpu
FAST = dict(batch_size=2, num_workers=2, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0, checkpoint_interval=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=8, num_valid=4,
                                  image_size=(96, 64), seed=0)


def rows(output: Path) -> list[dict]:
    with open(output / "metrics.csv", newline="") as stream:
        return list(csv.DictReader(stream))


def test_trains_on_cuda_and_its_files_load_on_the_cpu(data, tmp_path, tiny_kwargs):
    torch.manual_seed(0)
    model = RFDETRNano(**{**tiny_kwargs, "device": "cuda"})
    model.train(dataset_dir=str(data), output_dir=str(tmp_path), epochs=2, **FAST)
    assert {p.device.type for p in model.model.parameters()} == {"cuda"}
    logged = rows(tmp_path)
    assert sorted({int(r["epoch"]) for r in logged if r.get("val/mAP_50")}) == [0, 1]
    losses = [float(r["train/loss"]) for r in logged if r.get("train/loss")]
    assert losses and all(math.isfinite(x) and x > 0 for x in losses)

    image = np.asarray(Image.open(next((data / "valid").glob("*.jpg"))).convert("RGB"))
    cpu_model = from_checkpoint(str(tmp_path / "last_ema.pth"), device="cpu")
    assert cpu_model.device.type == "cpu"
    model.model.load_state_dict(cpu_model.model.state_dict())  # the same weights on both devices
    on_cuda = model.predict(image, threshold=0.0)
    on_cpu = cpu_model.predict(image, threshold=0.0)
    assert len(on_cuda) == len(on_cpu) > 0
    np.testing.assert_allclose(on_cuda.confidence[:5], on_cpu.confidence[:5], atol=1e-3)


def test_resume_on_cuda_continues_the_run(data, tmp_path, tiny_kwargs):
    torch.manual_seed(0)
    RFDETRNano(**{**tiny_kwargs, "device": "cuda"}).train(dataset_dir=str(data), output_dir=str(tmp_path),
                                                          epochs=1, **FAST)
    first = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    RFDETRNano(**{**tiny_kwargs, "device": "cuda"}).train(dataset_dir=str(data), output_dir=str(tmp_path),
                                                          epochs=2, resume=str(tmp_path / "last.ckpt"), **FAST)
    second = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    assert (first["epoch"], second["epoch"]) == (0, 1)
    assert second["global_step"] == 2 * first["global_step"]
    assert sorted({int(r["epoch"]) for r in rows(tmp_path) if r.get("val/mAP_50")}) == [0, 1]

