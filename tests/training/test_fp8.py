"""FP8 backends: which layers qualify, the layer swaps (same keys, same weights, fused activations
kept), torchao's conversion of a tiny detector on the CPU (emulated FP8), and the EMA filter."""

import pytest
import torch
import torch.nn.functional as F
from tiny_config import TINY
from torch import nn

from detrkit.models.build import build_model
from detrkit.ops.linear import Linear
from detrkit.training.accel.fp8 import (
    FP8_BACKENDS,
    choose_fp8_backend,
    ema_state_filter,
    fp8_eligible,
    swap_linear_layers,
)
from detrkit.variants import RFDETRNanoConfig


def tiny_detector() -> nn.Module:
    torch.manual_seed(0)
    return build_model(RFDETRNanoConfig(**TINY), 0.0).train()


@pytest.mark.parametrize(("layer", "name", "eligible"), [
    (nn.Linear(32, 64), "transformer.decoder.layers.0.linear1", True),
    (Linear(48, 48), "backbone.0.encoder.encoder.encoder.layer.1.attention.output.dense", True),
    (nn.Linear(32, 6), "transformer.decoder.layers.0.cross_attn.some_proj", False),  # 6 outputs
    (nn.Linear(24, 32), "x", False),  # 24 inputs
    (Linear(32, 32), "class_embed", False),
    (Linear(32, 32), "bbox_embed.layers.0", False),
    (Linear(32, 32), "transformer.enc_out_bbox_embed.3.layers.1", False),
    (Linear(32, 32), "transformer.enc_out_class_embed.0", False),
    (Linear(32, 32), "transformer.decoder.layers.1.cross_attn.sampling_offsets", False),
    (Linear(32, 32), "transformer.decoder.layers.1.cross_attn.attention_weights", False),
    (Linear(64, 32), "transformer.decoder.ref_point_head.layers.0", False),
    (nn.Conv2d(32, 32, 1), "conv", False),
])
def test_which_layers_compute_in_fp8(layer, name, eligible):
    assert fp8_eligible(layer, name) is eligible


def test_ema_skips_transformer_engine_extra_state_only():
    assert not ema_state_filter("transformer.decoder.layers.0.linear1._extra_state")
    for kept in ("transformer.decoder.layers.0.linear1.weight", "backbone.0.encoder.x.bias", "_kp_active_mask",
                 "transformer.extra_state_size"):
        assert ema_state_filter(kept)


@pytest.mark.parametrize(("requested", "te", "torchao", "chosen"), [
    ("auto", True, True, "transformer-engine"), ("auto", False, True, "torchao"),
    ("auto", False, False, "transformer-engine"), ("torchao", True, False, "torchao"),
    ("transformer-engine", False, True, "transformer-engine"),
])
def test_backend_choice(requested, te, torchao, chosen):
    assert choose_fp8_backend(requested, te, torchao) == chosen


def test_backends_say_how_the_trainer_runs_them():
    assert FP8_BACKENDS["torchao"].trainer_precision() == {"precision": "bf16-mixed"}
    assert FP8_BACKENDS["transformer-engine"].lightning_precision == "transformer-engine"
    assert FP8_BACKENDS["transformer-engine"].install == 'pip install "detrkit[cuda]"'


class _FakeFP8Linear(nn.Module):
    """Stands in for te.Linear: its own parameters plus an `_extra_state` entry."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def get_extra_state(self):
        return torch.zeros(1)

    def set_extra_state(self, state):
        pass


def test_swap_keeps_keys_and_weights_and_builds_shared_layers_once():
    detector = tiny_detector()
    shared = Linear(32, 32)
    detector.transformer.extra = nn.ModuleList([shared, shared])
    before = detector.state_dict()
    built = []

    def build(linear):
        built.append(linear)
        return _FakeFP8Linear(linear)

    report = swap_linear_layers(detector, build, "fake")
    assert detector.transformer.extra[0] is detector.transformer.extra[1]
    assert sum(layer is shared for layer in built) == 1
    after = {k: v for k, v in detector.state_dict().items() if ema_state_filter(k)}
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert "class_embed" in report.kept and "transformer.decoder.layers.0.linear1" in report.converted
    assert isinstance(detector.class_embed, Linear) and isinstance(detector.transformer.decoder.layers[0].linear1,
                                                                   _FakeFP8Linear)
    assert any(k.endswith("_extra_state") for k in detector.state_dict())


def test_torchao_conversion_of_a_tiny_detector_on_the_cpu():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    from detrkit.training.accel.fp8 import convert_for_fp8, revert_fp8

    detector = tiny_detector()
    before = {k: v.clone() for k, v in detector.state_dict().items()}
    params = {name: id(p) for name, p in detector.named_parameters()}
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = detector.eval()(pixels)
        detector.train()

    report = convert_for_fp8(detector, emulate=True)
    assert report.converted and report.kept
    assert "transformer.decoder.layers.0.linear1" in report.converted
    assert {"class_embed", "bbox_embed.layers.2"} <= set(report.kept)
    assert isinstance(detector.transformer.decoder.layers[0].linear1, Float8Linear)
    assert not isinstance(detector.class_embed, Float8Linear)
    state = detector.state_dict()
    assert list(state) == list(before) and all(torch.equal(state[k], before[k]) for k in before)
    assert {name: id(p) for name, p in detector.named_parameters()} == params  # the optimizer's parameters stay

    relu_layer = detector.transformer.decoder.layers[0].linear1  # fused ReLU kept
    x = torch.randn(5, relu_layer.in_features)
    assert torch.equal(relu_layer(x), F.relu(Float8Linear.forward(relu_layer, x)))
    gelu_layer = detector.backbone[0].encoder.encoder.encoder.layer[0].mlp.fc1
    assert torch.equal(gelu_layer(torch.ones(2, gelu_layer.in_features)),
                       F.gelu(Float8Linear.forward(gelu_layer, torch.ones(2, gelu_layer.in_features))))

    out = detector(pixels)
    loss = sum(t.square().mean() for t in (out.pred_logits, out.pred_boxes, out.enc_outputs.pred_logits))
    loss.backward()
    assert torch.isfinite(loss)
    assert detector.transformer.decoder.layers[0].linear1.weight.grad is not None
    with torch.no_grad():
        converted = detector.eval()(pixels)
        detector.train()
    # FP8's 3-bit mantissa moves the logits by a few percent of their spread (a query whose top-k
    # proposal changed may move more, hence the median)
    assert (converted.pred_logits - exact.pred_logits).abs().median() < 0.1 * exact.pred_logits.std()

    assert revert_fp8(detector) == len(report.converted)
    assert not any(isinstance(m, Float8Linear) for m in detector.modules())
    layer = detector.transformer.decoder.layers[0].linear1
    assert isinstance(layer, Linear) and layer.activation == "relu"
    assert {name: id(p) for name, p in detector.named_parameters()} == params
    with torch.no_grad():
        detector.eval()
        torch.testing.assert_close(detector(pixels).pred_logits, exact.pred_logits)
