"""Parameter groups and LR schedules against the numbers of spec section 12.2-12.3."""

import math

import pytest
import torch

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.training.optim import build_optimizer, encoder_layer_id, lr_factor, parameter_groups

NANO_GROUPS = dict(lr=1e-4, lr_encoder=1.5e-4, weight_decay=1e-4, layer_decay=0.8, component_decay=0.7,
                   num_encoder_layers=13)


@pytest.fixture(scope="module")
def nano_groups():
    return parameter_groups(build_model(ModelConfig()).named_parameters(), **NANO_GROUPS)


def test_nano_has_28_merged_groups_with_spec_rates(nano_groups):
    assert len(nano_groups) == 28
    rates = {round(g["lr"], 12) for g in nano_groups}
    for expected in (3.233e-6, 4.041e-6, 4.704e-5, 7.35e-5, 7e-5, 1e-4):
        assert any(math.isclose(rate, expected, rel_tol=1e-3) for rate in rates), expected
    first = nano_groups[0]
    assert first["lr"] == 1e-4 and first["weight_decay"] == 1e-4  # heads, projector, queries come first
    assert nano_groups[-1]["lr"] == pytest.approx(7e-5)  # decoder last


def test_every_trainable_parameter_is_in_exactly_one_group(nano_groups):
    model = build_model(ModelConfig())
    grouped = [p for g in nano_groups for p in g["params"]]
    assert len(grouped) == len(set(map(id, grouped))) == sum(p.requires_grad for p in model.parameters())
    assert not model.backbone[0].encoder.encoder.embeddings.mask_token.requires_grad  # never used: frozen


def test_encoder_weight_decay_exemptions():
    model = build_model(ModelConfig())
    groups = parameter_groups(model.named_parameters(), **NANO_GROUPS)
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    prefix = "backbone.0.encoder.encoder."
    assert decay_of[id(named[prefix + "encoder.layer.0.attention.attention.query.bias"])] == 0.0
    assert decay_of[id(named[prefix + "encoder.layer.0.norm1.weight"])] == 0.0
    assert decay_of[id(named[prefix + "embeddings.position_embeddings"])] == 0.0
    assert decay_of[id(named[prefix + "encoder.layer.0.layer_scale1.lambda1"])] == 1e-4
    assert decay_of[id(named[prefix + "encoder.layer.0.mlp.fc1.weight"])] == 1e-4
    assert decay_of[id(named["transformer.decoder.layers.0.linear1.bias"])] == 1e-4


def test_frozen_parameters_are_left_out():
    model = build_model(ModelConfig(freeze_encoder=True))
    groups = parameter_groups(model.named_parameters(), **NANO_GROUPS)
    assert len(groups) == 2  # others and decoder
    assert encoder_layer_id("x.embeddings.cls_token", 13) == 0
    assert encoder_layer_id("x.encoder.layer.11.mlp.fc1.weight", 13) == 12
    assert encoder_layer_id("x.layernorm.weight", 13) == 14


def test_step_schedule_with_warmup():
    factor = lr_factor("step", total_steps=100, epochs=10, warmup_epochs=2, lr_drop=5)
    assert [factor(s) for s in (0, 10, 19)] == [0.0, 0.5, 0.95]
    assert factor(20) == 1.0 and factor(49) == 1.0 and factor(50) == 0.1


def test_cosine_schedule_ends_at_min_factor():
    factor = lr_factor("cosine", total_steps=100, epochs=10, warmup_epochs=0, min_factor=0.1)
    assert factor(0) == pytest.approx(1.0)
    assert factor(50) == pytest.approx(0.55)
    assert factor(100) == pytest.approx(0.1)


def test_optimizer_is_adamw_with_group_rates():
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer([("head." + n, p) for n, p in model.named_parameters()], NANO_GROUPS)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["lr"] == 1e-4 and optimizer.defaults["betas"] == (0.9, 0.999)
