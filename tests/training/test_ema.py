"""ModelEMA's update rule (spec 12.5) and the callback's schedule, dtype and hand-over."""

import math
from types import SimpleNamespace

import torch
from torch import nn

from detrkit.training.ema import EMACallback, ModelEMA


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))


def test_first_update_copies_then_decay_follows_the_warm_up():
    torch.manual_seed(0)
    live = Net()
    ema = ModelEMA(live, decay=0.9, tau=2.0)
    history = []
    for _ in range(3):
        with torch.no_grad():
            live.linear.weight.add_(1.0)
            live.scale.mul_(2.0)
            live.count.add_(1)
        history.append(live.linear.weight.clone())
        ema.update(live)
    # by hand: n=1 copy; n>=2 ema = d*ema + (1-d)*live, d = 0.9 * (1 - exp(-n/2))
    expected = history[0]
    for n in (2, 3):
        d = 0.9 * (1 - math.exp(-n / 2.0))
        expected = d * expected + (1 - d) * history[n - 1]
    torch.testing.assert_close(ema.module.linear.weight, expected, rtol=0, atol=1e-6)
    assert ema.updates == 3
    assert ema.module.count.item() == 3  # integer buffers are copied, not averaged
    assert not ema.module.training and not any(p.requires_grad for p in ema.module.parameters())


def test_state_round_trip():
    live = Net()
    ema = ModelEMA(live)
    ema.update(live)
    other = ModelEMA(Net())
    other.load_state_dict(ema.state_dict())
    assert other.updates == 1
    assert torch.equal(other.module.linear.weight, live.linear.weight)


def fake_run(live: nn.Module, global_step: int = 0):
    module = SimpleNamespace(model=live, ema=None)
    trainer = SimpleNamespace(global_step=global_step)
    return trainer, module


def test_callback_updates_on_optimizer_steps_at_its_interval_in_the_model_dtype():
    live = Net().double()  # the average is made after precision conversion: it keeps the dtype
    callback = EMACallback(decay=0.5, tau=1.0, update_interval=2)
    trainer, module = fake_run(live)
    callback.on_fit_start(trainer, module)
    assert module.ema is callback.ema and callback.ema.module.linear.weight.dtype == torch.float64
    for step in (0, 1, 1, 2, 2, 3, 4):  # micro-batches of one optimizer step repeat the step
        trainer.global_step = step
        callback.on_train_batch_end(trainer, module, None, None, 0)
    assert callback.ema.updates == 2  # steps 2 and 4


def test_callback_state_loaded_before_fit_start_is_applied_then():
    source = Net()
    saved = ModelEMA(source)
    saved.update(source)
    callback = EMACallback()
    callback.load_state_dict(saved.state_dict())
    assert callback.state_dict()["updates"] == 1  # a checkpoint taken now keeps it
    trainer, module = fake_run(Net(), global_step=7)
    callback.on_fit_start(trainer, module)
    assert callback.ema.updates == 1
    assert torch.equal(callback.ema.module.linear.weight, source.linear.weight)


def test_live_model_takes_the_average_after_training():
    live = Net()
    callback = EMACallback()
    trainer, module = fake_run(live)
    callback.on_fit_start(trainer, module)
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, module, None, None, 0)
    with torch.no_grad():
        live.linear.weight.zero_()
    callback.on_train_end(trainer, module)
    assert torch.equal(live.linear.weight, callback.ema.module.linear.weight)
    assert live.linear.weight.abs().sum() > 0
