"""build_trainer and its loggers: defaults, pass-through, missing logger packages."""

import importlib.util

import pytest

from detrkit.config import TrainConfig
from detrkit.training.trainer import build_loggers, build_trainer, split_train_kwargs


def config(tmp_path, **kwargs) -> TrainConfig:
    return TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path / "out"), **kwargs)


def test_defaults_one_device_csv_logger_and_clip(tmp_path):
    trainer = build_trainer(config(tmp_path, tensorboard=False, grad_accum_steps=3, epochs=7))
    assert trainer.num_devices == 1 and trainer.max_epochs == 7
    assert trainer.accumulate_grad_batches == 3 and trainer.gradient_clip_val == 0.1
    assert [type(l).__name__ for l in trainer.loggers] == ["EpochCSVLogger"]
    assert trainer.loggers[0].log_dir.rstrip("/") == str(tmp_path / "out")


def test_zero_clip_disables_clipping_and_kwargs_override(tmp_path):
    trainer = build_trainer(config(tmp_path, clip_max_norm=0.0), max_steps=5)
    assert trainer.gradient_clip_val is None and trainer.max_steps == 5


def test_split_sends_trainer_arguments_through_and_rejects_the_rest(tmp_path):
    train_config, passthrough = split_train_kwargs(
        {"dataset_dir": str(tmp_path), "epochs": 2, "limit_val_batches": 3, "devices": 1})
    assert train_config.epochs == 2 and train_config.devices == 1 and passthrough == {"limit_val_batches": 3}
    with pytest.raises(Exception, match="no_such_option"):
        split_train_kwargs({"dataset_dir": str(tmp_path), "no_such_option": 1})


@pytest.mark.parametrize("flag", ["wandb", "mlflow"])
def test_requested_logger_without_package_names_the_extra(tmp_path, flag):
    if importlib.util.find_spec(flag):
        pytest.skip(f"{flag} is installed")
    with pytest.raises(ImportError, match=r"detrkit\[loggers\]"):
        build_loggers(config(tmp_path, **{flag: True}))


def test_progress_bar_choices(tmp_path):
    assert not build_trainer(config(tmp_path, progress_bar=None)).progress_bar_callback
    from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar

    assert isinstance(build_trainer(config(tmp_path, progress_bar="tqdm")).progress_bar_callback, TQDMProgressBar)
    assert isinstance(build_trainer(config(tmp_path, progress_bar="rich")).progress_bar_callback, RichProgressBar)
    assert config(tmp_path, progress_bar=True).progress_bar == "tqdm"


def test_tensorboard_logger_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    names = [type(l).__name__ for l in build_loggers(config(tmp_path, tensorboard=True))]
    assert names == ["EpochCSVLogger", "TensorBoardLogger"]


def test_torchrun_layout_fills_in_auto_devices_and_node_count(monkeypatch):
    from detrkit.training.trainer import launched_topology

    assert launched_topology("auto", 1) == {"devices": "auto", "num_nodes": 1}  # not under torchrun
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("WORLD_SIZE", "16")  # torchrun --nproc_per_node=8 --nnodes=2
    assert launched_topology("auto", 1) == {"devices": 8, "num_nodes": 2}
    assert launched_topology(4, 3) == {"devices": 4, "num_nodes": 3}  # explicit settings stand


def test_only_data_parallel_strategies_are_accepted():
    from pydantic import ValidationError

    from detrkit.config import TrainConfig

    for name in ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true"):
        assert TrainConfig(dataset_dir=None, strategy=name).strategy == name
    with pytest.raises(ValidationError, match="strategy='fsdp' is not supported"):
        TrainConfig(dataset_dir=None, strategy="fsdp")


def test_unknown_train_keyword_names_the_closest_config_and_trainer_names(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        split_train_kwargs({"dataset_dir": str(tmp_path), "max_epoch": 3, "epoch": 2})
    text = str(caught.value)
    assert "`max_epoch` (did you mean `max_epochs`" in text and "`epoch` (did you mean `epochs`" in text
    assert "see detrkit.config.TrainConfig and pytorch_lightning.Trainer" in text
    with pytest.warns(FutureWarning, match="lr_drop"):  # a deprecated TrainConfig keyword is not unknown
        train_config, passthrough = split_train_kwargs({"dataset_dir": str(tmp_path), "lr_drop": 5, "max_steps": 2})
    assert train_config.lr_scheduler_kwargs == {"lr_drop": 5} and passthrough == {"max_steps": 2}


def test_clearml_is_not_supported(tmp_path):
    with pytest.raises(NotImplementedError, match="clearml=True"):
        build_loggers(config(tmp_path, clearml=True))


@pytest.mark.parametrize("workers", [0, 1])
def test_loaders_use_eval_batch_size_and_worker_defaults(tmp_path, tiny_kwargs, workers):
    from detrkit.config import ModelConfig
    from detrkit.datasets.synthetic import make_synthetic_dataset
    from detrkit.training import RFDETRDataModule

    data = make_synthetic_dataset(tmp_path / "data", num_train=4, num_valid=3, num_test=2, image_size=(64, 64))
    settings = dict(dataset_dir=str(data), output_dir=str(tmp_path / "out"), num_workers=workers)
    module = RFDETRDataModule(ModelConfig(**tiny_kwargs), TrainConfig(**settings, eval_batch_size=3))
    train, val, test = module.train_dataloader(), module.val_dataloader(), module.test_dataloader()
    assert (train.batch_size, val.batch_size, test.batch_size) == (4, 3, 3)
    for loader in (train, val):  # on the CPU: no pinning; workers persist and prefetch 2 batches when there are any
        assert (loader.pin_memory, loader.persistent_workers, loader.prefetch_factor) == (
            False, workers > 0, 2 if workers else None)
    module = RFDETRDataModule(ModelConfig(**tiny_kwargs), TrainConfig(**settings, pin_memory=True, prefetch_factor=4,
                                                                      persistent_workers=False))
    loader = module.val_dataloader()
    assert loader.batch_size == 4 and loader.pin_memory and not loader.persistent_workers
    assert loader.prefetch_factor == (4 if workers else None)
