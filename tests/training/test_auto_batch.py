"""batch_size="auto": the search, the accumulation, the memory probe's step, and where "auto" is refused."""

import math
import weakref

import pytest
import torch

from detrkit import RFDETRNano
from detrkit.config import ModelConfig, TrainConfig
from detrkit.losses.criterion import build_criterion
from detrkit.models.build import build_model
from detrkit.training import RFDETRDataModule, RFDETRModelModule, auto_batch
from detrkit.training.auto_batch import (
    MemoryProbe,
    choose_batch,
    largest_fitting,
    probe_side,
    process_count,
    resolve_auto_batch,
    safe_batch,
    synthetic_batch,
)

# threshold of a fake GPU (the largest batch that fits) -> sizes probed, largest fitting,
# batch without EMA, batch with EMA (x0.7)
SEARCHES = [
    (1, [1, 1, 2], 1, 1, 1),
    (3, [1, 1, 2, 4, 3], 3, 2, 1),
    (5, [1, 1, 2, 4, 8, 6, 5], 5, 4, 2),
    (37, [1, 1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37], 37, 33, 23),
    (100, [1, 1, 2, 4, 8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101], 100, 90, 63),
    (128, [1, 1, 2, 4, 8, 16, 32, 64, 128], 128, 115, 80),
    (500, [1, 1, 2, 4, 8, 16, 32, 64, 128], 128, 115, 80),
]


def gpu_with_room_for(threshold: int):
    return lambda size: size <= threshold


@pytest.mark.parametrize(("threshold", "probed", "largest", "batch", "batch_ema"), SEARCHES)
def test_search_probes_doubling_then_bisects(threshold, probed, largest, batch, batch_ema):
    assert largest_fitting(gpu_with_room_for(threshold)) == (largest, probed)
    choice = choose_batch(gpu_with_room_for(threshold), target_effective=16, world_size=1, use_ema=False,
                          ema_headroom=0.7)
    assert (choice.batch_size, choice.max_fitting, list(choice.probed)) == (batch, largest, probed)
    assert choice.grad_accum_steps == math.ceil(16 / batch)
    with_ema = choose_batch(gpu_with_room_for(threshold), target_effective=16, world_size=1, use_ema=True,
                            ema_headroom=0.7)
    assert (with_ema.batch_size, with_ema.grad_accum_steps) == (batch_ema, math.ceil(16 / batch_ema))


def test_safe_batch_floors_without_float_error():
    assert safe_batch(100, use_ema=False, ema_headroom=0.7) == 90
    assert safe_batch(100, use_ema=True, ema_headroom=0.7) == 63  # 90 * 0.7 is 62.99999999999999 in floats
    assert safe_batch(100, use_ema=True, ema_headroom=1.0) == 90
    assert safe_batch(1, use_ema=True, ema_headroom=0.1) == 1


@pytest.mark.parametrize(("world_size", "use_ema", "accumulation"), [
    (1, False, 4), (2, False, 2), (3, False, 2), (8, False, 1),  # per-device targets 16, 8, 6, 2 over batch 4
    (1, True, 8), (2, True, 4), (3, True, 3), (8, True, 1),  # over batch 2
])
def test_accumulation_reaches_the_per_device_target(world_size, use_ema, accumulation):
    choice = choose_batch(gpu_with_room_for(5), target_effective=16, world_size=world_size, use_ema=use_ema,
                          ema_headroom=0.7)
    assert (choice.batch_size, choice.grad_accum_steps) == (2 if use_ema else 4, accumulation)


@pytest.mark.parametrize("answers", [[False], [True, False]], ids=["first", "second-with-optimizer-state"])
def test_batch_of_one_that_does_not_fit_names_the_levers(answers):
    calls = iter(answers)
    with pytest.raises(RuntimeError, match="not even a batch of 1") as error:
        largest_fitting(lambda size: next(calls))
    assert "gradient_checkpointing=True" in str(error.value) and "resolution" in str(error.value)


def test_process_count_from_devices_and_nodes(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert process_count(2, 1) == 2
    assert process_count([0, 3], 2) == 4
    assert process_count("0,1", 1) == 2
    assert process_count("3", 2) == 6
    assert process_count("auto", 1) == max(1, torch.cuda.device_count())
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert process_count("auto", 1) == 8  # torchrun: 4 processes on each of 2 nodes


def test_probe_side_is_the_largest_training_scale(tiny_kwargs):
    config = ModelConfig(**tiny_kwargs)  # resolution 64, block 32
    assert probe_side(config, TrainConfig(dataset_dir=None, multi_scale="off")) == 64
    assert probe_side(config, TrainConfig(dataset_dir=None)) == 224  # (64 // 32 + 5) * 32
    assert probe_side(config, TrainConfig(dataset_dir=None, multi_scale="per-sample", expanded_scales=False)) == 192


def test_synthetic_batch_holds_identical_boxes():
    batch = synthetic_batch(3, 64, 3, boxes_per_image=7, device=torch.device("cpu"))
    assert batch.pixels.shape == (3, 3, 64, 64) and batch.padding is None and len(batch) == 3
    for target in batch.targets:
        assert target.boxes.shape == (7, 4) and target.labels.tolist() == [0] * 7 and target.size == (64, 64)
        assert torch.equal(target.boxes, torch.tensor([[0.5, 0.5, 0.5, 0.5]]).expand(7, 4))


def tiny_probe(tiny_kwargs, criterion=None) -> tuple[torch.nn.Module, MemoryProbe]:
    config = ModelConfig(**{**tiny_kwargs, "layer_norm": False})  # BatchNorm in the projector
    torch.manual_seed(0)
    detector = build_model(config).eval()
    criterion = criterion or build_criterion(config, TrainConfig(dataset_dir=None))
    return detector, MemoryProbe(detector, criterion, side=64, num_channels=3, boxes_per_image=5,
                                 autocast_dtype=None, fused=False)


def test_probe_step_leaves_the_detector_as_it_was_and_allocates_optimizer_state(tiny_kwargs):
    detector, probe = tiny_probe(tiny_kwargs)
    kept_grad = torch.ones_like(detector.class_embed.weight)
    detector.class_embed.weight.grad = kept_grad
    before = {name: value.clone() for name, value in detector.state_dict().items()}
    probe.step(2)
    probe.step(3)
    after = detector.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # weights and BatchNorm statistics
    assert after["backbone.0.projector.stages.0.0.cv1.bn.num_batches_tracked"].item() == 0
    assert detector.class_embed.weight.grad is kept_grad
    assert all(p.grad is None for p in detector.parameters() if p is not detector.class_embed.weight)
    assert not detector.training
    trainable = [p for p in detector.parameters() if p.requires_grad]
    assert len(probe.optimizer.state) == len(trainable) == len(probe.shadow)
    for shadow, param in zip(probe.shadow, trainable):
        state = probe.optimizer.state[shadow]
        assert state["exp_avg"].shape == param.shape and state["step"].item() == 2
        assert shadow.grad is None
    assert sum(state["exp_avg_sq"].sum().item() for state in probe.optimizer.state.values()) > 0  # real gradients


def test_probe_step_refuses_a_non_finite_loss(tiny_kwargs):
    class NaNLoss:
        def __call__(self, outputs, targets, groups, image_size):
            return type("Losses", (), {"total": outputs.pred_boxes.sum() * float("nan")})()

    detector, probe = tiny_probe(tiny_kwargs, NaNLoss())
    with pytest.raises(RuntimeError, match="probe loss on a synthetic batch of 2 is nan"):
        probe.step(2)
    assert all(p.grad is None for p in detector.parameters()) and not detector.training


def test_fits_is_false_on_out_of_memory_only(tiny_kwargs, monkeypatch):
    _, probe = tiny_probe(tiny_kwargs)
    assert probe.fits(1) is True

    def out_of_memory(size):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(probe, "step", out_of_memory)
    assert probe.fits(4) is False
    monkeypatch.setattr(probe, "step", lambda size: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        probe.fits(4)


@pytest.mark.parametrize("settings", [{}, {"accelerator": "cpu"}, {"device": "cpu"}])
def test_resolve_refuses_a_run_without_cuda(tiny_kwargs, settings):
    detector = build_model(ModelConfig(**tiny_kwargs))
    config = TrainConfig(dataset_dir=None, batch_size="auto", **settings)
    with pytest.raises(RuntimeError, match=r'batch_size="auto" needs a CUDA GPU to probe, but this run trains on cpu'):
        resolve_auto_batch(detector, ModelConfig(**tiny_kwargs), config, world_size=1)


def test_resolve_writes_the_choice_into_a_copy_of_the_config(tiny_kwargs, monkeypatch, caplog):
    """The wiring around the probe, on the CPU: a fake GPU that fits 37 images, the real probe object."""
    probes = []
    monkeypatch.setattr(auto_batch, "_require_cuda", lambda detector, config: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same fp32 precision on any machine

    def fits(self, size):
        probes.append(weakref.ref(self))
        return size <= 37

    monkeypatch.setattr(auto_batch.MemoryProbe, "fits", fits)
    monkeypatch.setattr(auto_batch, "_agreed", lambda fits: fits)  # one process stands for both
    model_config = ModelConfig(**tiny_kwargs)
    config = TrainConfig(dataset_dir=None, batch_size="auto", auto_batch_target_effective=64, lr=3e-4)
    with caplog.at_level("INFO", logger="detrkit.training.auto_batch"):
        resolved = resolve_auto_batch(build_model(model_config), model_config, config, world_size=2)
    assert (resolved.batch_size, resolved.grad_accum_steps) == (23, 2)  # floor(floor(37 * 0.9) * 0.7); ceil(32 / 23)
    assert resolved.lr == 3e-4 and config.batch_size == "auto" and config.grad_accum_steps == 1
    assert len(probes) == 13 and probes[0]() is None  # the shadow weights and optimizer state are released
    assert ("up to 37 images of 224x224 fit (32-true, probed 1, 1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37); "
            "training with batch_size=23 x grad_accum_steps=2 per device on 2 process(es), EMA headroom 0.7"
            ) in caplog.text


def test_several_processes_must_come_from_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(RuntimeError, match="several processes needs them launched by torchrun"):
        auto_batch._agreed(lambda size: True)


def test_under_torchrun_each_process_probes_its_own_gpu(monkeypatch):
    config = TrainConfig(dataset_dir=None, batch_size="auto")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert auto_batch.probe_device(config, torch.device("cuda")) == torch.device("cuda", 3)
    assert auto_batch.probe_device(config, torch.device("cpu")) == torch.device("cpu")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert auto_batch.probe_device(config, torch.device("cuda")) == torch.device("cuda")


def test_train_refuses_auto_on_cpu_before_reading_data_or_writing(tiny_kwargs, tmp_path):
    model = RFDETRNano(**tiny_kwargs)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*Set an integer batch_size"):
        model.train(dataset_dir=str(tmp_path / "no-such-data"), output_dir=str(tmp_path / "out"),
                    batch_size="auto", epochs=1, num_workers=0, progress_bar=None, tensorboard=False)
    assert not (tmp_path / "out").exists()


def test_lightning_api_refuses_unresolved_auto(tiny_kwargs, tmp_path):
    model_config = ModelConfig(**tiny_kwargs)
    config = TrainConfig(dataset_dir=str(tmp_path / "no-such-data"), batch_size="auto")
    with pytest.raises(ValueError, match=r'batch_size="auto" is resolved by RFDETR.train\(\) only'):
        RFDETRDataModule(model_config, config)
    with pytest.raises(ValueError, match=r'batch_size="auto" is resolved by RFDETR.train\(\) only'):
        RFDETRModelModule(model_config, config)


@pytest.mark.gpu
def test_probe_on_cuda_picks_a_batch_and_leaves_the_weights(tiny_kwargs, caplog, monkeypatch):
    probes = []

    class TrackedProbe(auto_batch.MemoryProbe):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            probes.append((weakref.ref(self), kwargs["fused"], self.autocast_dtype))

    monkeypatch.setattr(auto_batch, "MemoryProbe", TrackedProbe)
    model = RFDETRNano(**{**tiny_kwargs, "device": "cuda"})
    before = {name: value.clone() for name, value in model.model.state_dict().items()}
    config = TrainConfig(dataset_dir=None, batch_size="auto", auto_batch_max_targets_per_image=20)
    with caplog.at_level("INFO", logger="detrkit.training.auto_batch"):
        resolved = resolve_auto_batch(model.model, model.model_config, config, world_size=2)
    assert isinstance(resolved.batch_size, int) and 1 <= resolved.batch_size <= 80  # 128 * 0.9 * 0.7 at most
    assert resolved.grad_accum_steps == max(1, math.ceil(8 / resolved.batch_size))
    assert all(torch.equal(before[name], value) for name, value in model.model.state_dict().items())
    assert all(p.grad is None for p in model.model.parameters()) and not model.model.training
    (probe, fused, dtype), = probes
    assert probe() is None  # the shadow weights and their optimizer state are released
    bf16 = torch.cuda.get_device_capability() >= (8, 0)
    assert (fused, dtype) == ((True, torch.bfloat16) if bf16 else (False, torch.float16))
    assert f"batch_size={resolved.batch_size} x grad_accum_steps={resolved.grad_accum_steps}" in caplog.text
