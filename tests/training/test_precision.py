"""amp_dtype: its resolution per device (spec 12.7), the Trainer it configures, fused AdamW and its
clipping, the deprecated amp=False, and predict() in a reduced inference dtype."""

import logging
import warnings

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from detrkit import RFDETRNano
from detrkit.config import TrainConfig
from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training.accel.precision import (
    Accelerators,
    device_indices,
    fused_adamw_applies,
    resolve_precision,
    selected_accelerators,
)
from detrkit.training.trainer import build_trainer

H200 = Accelerators("cuda", ("NVIDIA H200",), ((9, 0),))
T4 = Accelerators("cuda", ("Tesla T4",), ((7, 5),))
MIXED = Accelerators("cuda", ("NVIDIA H200", "Tesla T4"), ((9, 0), (7, 5)))
CPU, MPS = Accelerators("cpu"), Accelerators("mps")


@pytest.mark.parametrize(("amp_dtype", "devices", "expected"), [
    ("auto", H200, "bf16-mixed"), ("bf16", H200, "bf16-mixed"), ("fp16", H200, "16-mixed"),
    ("fp32", H200, "32-true"), ("auto", T4, "16-mixed"), ("fp16", T4, "16-mixed"), ("auto", MIXED, "16-mixed"),
    ("auto", Accelerators("cuda", ("AMD MI300X",), ((9, 4),), rocm=True), "bf16-mixed"),
    ("auto", CPU, "32-true"), ("bf16", CPU, "32-true"), ("fp16", CPU, "32-true"), ("fp8", H200, "transformer-engine"),
    ("auto", MPS, "16-mixed"), ("fp16", MPS, "16-mixed"), ("fp32", MPS, "32-true"),
])
def test_resolution_table(amp_dtype, devices, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        resolved = resolve_precision(amp_dtype, devices)
    assert resolved.lightning == expected
    assert resolved.autocast_dtype == {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16,
                                       "32-true": None, "transformer-engine": torch.bfloat16}[expected]


def test_bf16_without_native_support_warns_and_takes_fp16():
    with pytest.warns(UserWarning, match=r"native bf16.*1× Tesla T4.*fp16-mixed"):
        assert resolve_precision("bf16", T4).lightning == "16-mixed"
    with pytest.warns(UserWarning, match="not supported on MPS"):
        assert resolve_precision("bf16", MPS).lightning == "16-mixed"


def test_fp8_runs_under_its_backend_on_gpus_of_capability_8_9():
    assert resolve_precision("fp8", H200).lightning == "transformer-engine"
    torchao = resolve_precision("fp8", H200, fp8_backend="torchao")
    assert (torchao.lightning, torchao.autocast_dtype) == ("bf16-mixed", torch.bfloat16)
    assert resolve_precision("fp8", Accelerators("cuda", ("NVIDIA L4",), ((8, 9),))).lightning == "transformer-engine"
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer on every selected GPU; Tesla T4 \(7.5\)"):
        resolve_precision("fp8", MIXED)
    for devices in (CPU, MPS):
        with pytest.raises(ValueError, match=f"compute capability 8.9 or newer, not {devices.kind.upper()}"):
            resolve_precision("fp8", devices)


def test_description_line():
    assert resolve_precision("auto", H200).describe() == "precision: bf16-mixed on 1× NVIDIA H200"
    two = Accelerators("cuda", ("NVIDIA H200",) * 2, ((9, 0),) * 2)
    assert resolve_precision("auto", two).describe() == "precision: bf16-mixed on 2× NVIDIA H200"
    assert resolve_precision("auto", CPU).describe() == "precision: 32-true on CPU"


def test_fused_adamw_only_on_cuda_without_a_scaler():
    assert resolve_precision("auto", H200).fused_adamw()
    assert not resolve_precision("auto", H200).fused_adamw(requested=False)
    assert not resolve_precision("fp16", H200).fused_adamw()
    assert not resolve_precision("fp32", H200).fused_adamw()
    assert not fused_adamw_applies(True, "cpu", "bf16-mixed")
    assert fused_adamw_applies(True, "cpu", "32-true") and not fused_adamw_applies(False, "cpu", "32-true")
    assert not fused_adamw_applies(True, "mps", "32-true")
    assert fused_adamw_applies(True, "cuda", "bf16-true")


def test_gpu_selection_follows_devices():
    assert device_indices(2, 4) == [0, 1]
    assert device_indices("auto", 3) == [0, 1, 2]
    assert device_indices(-1, 2) == [0, 1]
    assert device_indices("0,2", 4) == [0, 2]
    assert device_indices([3], 4) == [3]
    assert device_indices("1", 4) == [0]


def test_cpu_accelerators_on_this_machine():
    assert selected_accelerators("cpu", 1).kind == "cpu"
    if not torch.cuda.is_available():
        assert selected_accelerators("auto", 1).kind in ("cpu", "mps")
        assert selected_accelerators("gpu", 1).kind in ("cpu", "mps")


@pytest.mark.parametrize(("given", "expected"), [
    (None, "fp32"), ("BF16", "bf16"), (" fp16 ", "fp16"), ("auto", "auto"), ("fp8", "fp8"),
])
def test_amp_dtype_field(given, expected):
    assert TrainConfig(dataset_dir=None, amp_dtype=given).amp_dtype == expected


def test_unknown_amp_dtype_warns_and_means_auto():
    with pytest.warns(UserWarning, match="amp_dtype='float8' is not one of"):
        assert TrainConfig(dataset_dir=None, amp_dtype="float8").amp_dtype == "auto"


def test_fp8_with_auto_batch_is_rejected_at_config_time():
    with pytest.raises(ValidationError, match="explicit integer batch_size"):
        TrainConfig(dataset_dir=None, amp_dtype="fp8", batch_size="auto")


@pytest.mark.parametrize("bad", [0, -2, True, "big", 2.5])
def test_batch_size_values(bad):
    with pytest.raises(ValidationError, match="batch_size"):
        TrainConfig(dataset_dir=None, batch_size=bad)
    assert TrainConfig(dataset_dir=None, batch_size="auto").batch_size == "auto"


def test_trainer_on_cpu_is_fp32_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(TrainConfig(dataset_dir=None, output_dir=str(tmp_path), amp_dtype="bf16",
                                            accelerator="cpu", progress_bar=None, tensorboard=False))
    assert trainer.precision == "32-true"
    assert "precision: 32-true on CPU" in caplog.text
    assert "amp_dtype='bf16' applies to GPUs only" in caplog.text


def test_precision_trainer_argument_wins(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(TrainConfig(dataset_dir=None, output_dir=str(tmp_path), accelerator="cpu",
                                            progress_bar=None, tensorboard=False), precision="bf16-mixed")
    assert trainer.precision == "bf16-mixed"
    assert "precision: bf16-mixed (set by the precision= Trainer argument) on CPU" in caplog.text


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=4, num_valid=2,
                                  image_size=(64, 64), seed=0)


FAST = dict(epochs=1, batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, evaluation_plots=False, seed=0, max_steps=2)


def test_deprecated_amp_false_trains_in_fp32(tiny_kwargs, shapes, tmp_path, monkeypatch):
    seen = {}

    def spy(train_config, **kwargs):
        seen["amp_dtype"] = train_config.amp_dtype
        raise KeyboardInterrupt  # stop before fitting: the resolved config is all this test needs

    monkeypatch.setattr("detrkit.training.trainer.build_trainer", spy)
    model = RFDETRNano(**tiny_kwargs, amp=False)
    with pytest.warns(FutureWarning, match="amp=False on the model is deprecated"), pytest.raises(KeyboardInterrupt):
        model.train(dataset_dir=str(shapes), output_dir=str(tmp_path / "a"), **FAST)
    assert seen["amp_dtype"] == "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # an explicit amp_dtype is taken as given
        with pytest.raises(KeyboardInterrupt):
            model.train(dataset_dir=str(shapes), output_dir=str(tmp_path / "b"), amp_dtype="bf16", **FAST)
    assert seen["amp_dtype"] == "bf16"


def test_bf16_mixed_training_keeps_fp32_weights_losses_and_average(tiny_kwargs, shapes, tmp_path):
    """Lightning's bf16-mixed on the CPU runs the same autocast path as on CUDA."""
    model = RFDETRNano(**tiny_kwargs)
    model.train(dataset_dir=str(shapes), output_dir=str(tmp_path), precision="bf16-mixed", **FAST)
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    floats = [v for v in saved["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    ema = saved["callbacks"]["EMA"]["weights"]
    assert all(v.dtype == torch.float32 for v in ema.values() if v.is_floating_point())
    assert all(p.dtype == torch.float32 for p in model.model.parameters())
    assert all(torch.isfinite(v).all() for v in floats)


def test_losses_are_fp32_under_autocast(tiny_kwargs):
    from detrkit.config import TrainConfig as Train
    from detrkit.training.module import RFDETRModelModule
    from detrkit.variants import RFDETRNanoConfig

    module = RFDETRModelModule(RFDETRNanoConfig(**tiny_kwargs), Train(dataset_dir=None))
    pixels = torch.randn(2, 3, 64, 64)
    from detrkit.structures import Target

    targets = [Target(torch.tensor([[0.5, 0.5, 0.2, 0.3]]), torch.tensor([1]), 0, (64, 64), (64, 64))] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = module.model.train()(pixels)
        assert outputs.pred_logits.dtype == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            losses = module.criterion(outputs, targets, groups=module.model.groups)
    assert losses.total.dtype == torch.float32
    assert outputs.pred_boxes.dtype == torch.float32  # box re-parameterisation runs in fp32


def test_fused_optimizer_clipping_matches_plain_clipping(tiny_kwargs):
    """Fused AdamW refuses Lightning's clipping; the module clips the optimizer's parameters itself."""
    from detrkit.training.module import RFDETRModelModule
    from detrkit.variants import RFDETRNanoConfig

    module = RFDETRModelModule(RFDETRNanoConfig(**tiny_kwargs), TrainConfig(dataset_dir=None))
    params = [p for p in module.model.parameters() if p.requires_grad]
    torch.manual_seed(0)
    grads = [torch.randn_like(p) for p in params]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert norm > 1
    expected = [g * (0.1 / (norm + 1e-6)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g
    fused = torch.optim.AdamW(params, fused=True)
    assert fused._step_supports_amp_scaling
    module.configure_gradient_clipping(fused, gradient_clip_val=0.1, gradient_clip_algorithm="norm")
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad, want)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    assert float(total) == pytest.approx(0.1, rel=1e-4)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_predict_in_a_reduced_dtype_matches_fp32(fitted, dtype):
    """Stated tolerance: the same detections above 0.5, confidences within 0.02 and box corners
    within 1.5% of the image side of fp32's."""
    exact, image = fitted
    reduced = RFDETRNano(**{**exact.model_config.model_dump(), "inference_dtype": dtype, "pretrain_weights": None})
    reduced.model.load_state_dict(exact.model.state_dict())
    want, got = exact.predict(image, threshold=0.5), reduced.predict(image, threshold=0.5)
    assert sorted(want.class_id.tolist()) == [1, 3]
    assert got.confidence.dtype == np.float32 and got.xyxy.dtype == np.float32
    assert got.class_id.tolist() == want.class_id.tolist()
    np.testing.assert_allclose(got.confidence, want.confidence, atol=0.02)
    np.testing.assert_allclose(got.xyxy, want.xyxy, atol=0.015 * 64)
