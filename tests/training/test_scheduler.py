"""Configurable optimizers and LR schedulers (spec 12.2-12.3): built over detrkit's parameter groups."""

import functools
import logging

import pytest
import torch

from detrkit.training.optim import build_optimizer, build_scheduler

GROUPS = dict(lr=1e-2, lr_encoder=1.5e-2, weight_decay=1e-4, layer_decay=0.8, component_decay=0.7,
              num_encoder_layers=2)


def named_parameters():
    """One parameter per section: heads (lr), encoder block 0 (decayed lr), decoder (lr * 0.7)."""
    names = ("class_embed.weight", "backbone.0.encoder.encoder.layer.0.mlp.fc1.weight",
             "transformer.decoder.layers.0.linear1.weight")
    return [(name, torch.nn.Parameter(torch.ones(2, 2))) for name in names]


def lrs(optimizer):
    return [pytest.approx(group["lr"]) for group in optimizer.param_groups]


GROUP_LRS = [1e-2, 1.5e-2 * 0.8**2 * 0.7**2, 1e-2 * 0.7]


@pytest.mark.parametrize("name", ["sgd", "SGD", "adamw", "Adam", "rmsprop"])
def test_short_names_get_the_parameter_groups_lr_and_weight_decay(name):
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer=name)
    assert type(optimizer).__name__.lower() == name.lower()
    assert [group["lr"] for group in optimizer.param_groups] == lrs(optimizer) == GROUP_LRS
    assert optimizer.defaults["lr"] == 1e-2 and optimizer.defaults["weight_decay"] == 1e-4


def test_optimizer_kwargs_reach_the_optimizer():
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd", optimizer_kwargs={"momentum": 0.9,
                                                                                              "nesterov": True})
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"]
    with pytest.raises(TypeError, match="optimizer 'sgd' rejected its arguments"):
        build_optimizer(named_parameters(), GROUPS, optimizer="sgd", optimizer_kwargs={"betas": (0.9, 0.99)})


@pytest.mark.parametrize("spec", ["torch.optim.SGD", torch.optim.SGD, functools.partial(torch.optim.SGD, momentum=0.5)])
def test_paths_classes_and_partials_are_called_with_the_groups(spec):
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer=spec, optimizer_kwargs={"dampening": 0.1})
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["dampening"] == 0.1
    assert [group["lr"] for group in optimizer.param_groups] == GROUP_LRS  # the groups carry their rates
    assert [group["weight_decay"] for group in optimizer.param_groups] == [1e-4, 1e-4, 1e-4]


def test_unimportable_paths_name_the_setting():
    with pytest.raises(ValueError, match="optimizer='torch.optim.Nope' cannot be imported"):
        build_optimizer(named_parameters(), GROUPS, optimizer="torch.optim.Nope")
    optimizer = build_optimizer(named_parameters(), GROUPS)
    with pytest.raises(ValueError, match="lr_scheduler='no_such_module.Schedule' cannot be imported"):
        build_scheduler(optimizer, "no_such_module.Schedule", {}, total_steps=10, epochs=1, warmup_epochs=0)


def run(optimizer, entry, steps):
    seen = []
    for _ in range(steps):
        seen.append(round(optimizer.param_groups[0]["lr"], 8))
        optimizer.step()
        entry["scheduler"].step()
    return seen


def test_managed_presets_read_lr_drop_and_min_factor():
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    entry = build_scheduler(optimizer, "step", {"lr_drop": 2}, total_steps=40, epochs=10, warmup_epochs=1)
    assert entry["interval"] == "step" and isinstance(entry["scheduler"], torch.optim.lr_scheduler.LambdaLR)
    assert run(optimizer, entry, 10) == [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01, 0.01, 0.001, 0.001]
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    entry = build_scheduler(optimizer, "cosine", {"min_factor": 0.5}, total_steps=10, epochs=10, warmup_epochs=0)
    assert run(optimizer, entry, 11)[-1] == pytest.approx(0.005)


def test_explicit_scheduler_gets_a_linear_warmup_in_optimizer_steps():
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    entry = build_scheduler(optimizer, "torch.optim.lr_scheduler.StepLR", {"step_size": 2, "gamma": 0.5},
                            total_steps=20, epochs=10, warmup_epochs=2)  # 2 steps per epoch: 4 warm-up steps
    assert isinstance(entry["scheduler"], torch.optim.lr_scheduler.SequentialLR) and entry["interval"] == "step"
    assert run(optimizer, entry, 10) == [0.0025, 0.004375, 0.00625, 0.008125, 0.01, 0.01, 0.005, 0.005, 0.0025,
                                         0.0025]


def test_explicit_scheduler_stepped_per_epoch_warms_up_in_epochs():
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    schedule = functools.partial(torch.optim.lr_scheduler.ExponentialLR, gamma=0.5)
    entry = build_scheduler(optimizer, schedule, {}, total_steps=100, epochs=10, warmup_epochs=2, interval="epoch")
    assert entry["interval"] == "epoch"
    assert run(optimizer, entry, 5) == [0.005, 0.0075, 0.01, 0.005, 0.0025]
    with pytest.raises(ValueError, match="needs at least 2 epochs"):
        build_scheduler(optimizer, schedule, {}, total_steps=100, epochs=10, warmup_epochs=0.5, interval="epoch")
    without = build_scheduler(optimizer, "torch.optim.lr_scheduler.ConstantLR", {"factor": 0.5}, total_steps=100,
                              epochs=10, warmup_epochs=0)
    assert isinstance(without["scheduler"], torch.optim.lr_scheduler.ConstantLR)


def test_plateau_steps_per_epoch_on_its_monitor_without_warmup(caplog):
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    with caplog.at_level(logging.WARNING, logger="detrkit"):
        entry = build_scheduler(optimizer, "torch.optim.lr_scheduler.ReduceLROnPlateau", {"patience": 0},
                                total_steps=10, epochs=5, warmup_epochs=1, interval="step", monitor="val/mAP_50")
    assert "warmup_epochs=1 is ignored" in caplog.text
    assert isinstance(entry["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert (entry["interval"], entry["monitor"]) == ("epoch", "val/mAP_50")
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # no warm-up ramp


def test_scheduler_kwargs_errors_name_the_scheduler():
    optimizer = build_optimizer(named_parameters(), GROUPS, optimizer="sgd")
    with pytest.raises(TypeError, match="lr_scheduler 'torch.optim.lr_scheduler.StepLR' rejected"):
        build_scheduler(optimizer, "torch.optim.lr_scheduler.StepLR", {"steps": 3}, total_steps=10, epochs=1,
                        warmup_epochs=0)
