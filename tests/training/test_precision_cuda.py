"""Default precision on CUDA: bf16-mixed with fused AdamW and TF32 during fit, fp32 files, and
predict() in bf16 against fp32 on the same GPU."""

import math

import numpy as np
import pytest
import torch

from detrkit import RFDETRNano
from detrkit.datasets.synthetic import make_synthetic_dataset

pytestmark = pytest.mark.gpu


class Spy:
    """Lightning callback recording what the step ran with."""

    def __init__(self):
        import pytorch_lightning as pl

        outer = self

        class _Callback(pl.Callback):
            def on_train_batch_end(self, trainer, pl_module, *args):
                outer.fused = trainer.optimizers[0].defaults.get("fused")
                outer.matmul = torch.get_float32_matmul_precision()
                outer.precision = trainer.precision

        self.callback = _Callback()


def test_default_training_on_cuda_is_bf16_mixed_with_fused_adamw(tmp_path, tiny_kwargs, caplog):
    import logging

    data = make_synthetic_dataset(tmp_path / "data", num_train=8, num_valid=4, image_size=(96, 64), seed=0)
    spy = Spy()
    before = torch.get_float32_matmul_precision()
    model = RFDETRNano(**{**tiny_kwargs, "device": "cuda"})
    with caplog.at_level(logging.INFO):
        model.train(dataset_dir=str(data), output_dir=str(tmp_path / "out"), epochs=1, batch_size=2, num_workers=0,
                    progress_bar=None, tensorboard=False, seed=0, callbacks=[spy.callback])
    name = torch.cuda.get_device_name(0)
    expected = "bf16-mixed" if torch.cuda.get_device_capability(0) >= (8, 0) else "16-mixed"
    assert f"precision: {expected} on 1× {name}" in caplog.text
    assert spy.precision == expected and spy.matmul == "high"
    assert spy.fused is (expected == "bf16-mixed")
    assert torch.get_float32_matmul_precision() == before  # TF32 for the length of fit only
    saved = torch.load(tmp_path / "out" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(v.dtype == torch.float32 for v in saved["state_dict"].values() if v.is_floating_point())
    assert all(math.isfinite(float(v.float().sum())) for v in saved["state_dict"].values())


def test_predict_in_bf16_on_cuda_matches_fp32(fitted):
    """Same tolerance as the CPU test: detections above 0.5 equal, confidences within 0.02, box
    corners within 1.5% of the image side."""
    exact, image = fitted
    config = {**exact.model_config.model_dump(), "pretrain_weights": None, "device": "cuda"}
    fp32, bf16 = RFDETRNano(**config), RFDETRNano(**{**config, "inference_dtype": "bf16"})
    fp32.model.load_state_dict(exact.model.state_dict())
    bf16.model.load_state_dict(exact.model.state_dict())
    want, got = fp32.predict(image, threshold=0.5), bf16.predict(image, threshold=0.5)
    assert sorted(want.class_id.tolist()) == [1, 3]
    assert got.class_id.tolist() == want.class_id.tolist()
    np.testing.assert_allclose(got.confidence, want.confidence, atol=0.02)
    np.testing.assert_allclose(got.xyxy, want.xyxy, atol=0.015 * 64)
