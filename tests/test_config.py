"""ModelConfig validation: unknown keys, derived fields, divisibility, warnings."""

import warnings

import pytest
import torch
from pydantic import ValidationError

from detrkit import RFDETRNano, RFDETRSmall
from detrkit.config import ModelConfig, PretrainWeightsCompatibilityWarning
from detrkit.variants import RFDETRMediumConfig, RFDETRNanoConfig, RFDETRSegNanoConfig


def test_unknown_keyword_is_rejected_with_its_name():
    with pytest.raises(ValidationError, match="resolutoin"):
        RFDETRNanoConfig(resolutoin=640, pretrain_weights=None)
    with pytest.raises(ValidationError, match="gradient_accumulation"):
        RFDETRNano(pretrain_weights=None, gradient_accumulation=2)


def test_assignment_is_validated():
    config = RFDETRNanoConfig(pretrain_weights=None)
    with pytest.raises(ValidationError):
        config.dec_layers = "many"


def test_resolution_sets_position_grid_unless_given():
    assert RFDETRMediumConfig(pretrain_weights=None, resolution=640).positional_encoding_size == 40
    assert RFDETRMediumConfig(pretrain_weights=None).positional_encoding_size == 36
    assert RFDETRMediumConfig(pretrain_weights=None, resolution=640,
                              positional_encoding_size=36).positional_encoding_size == 36


def test_resolution_must_divide_into_windows():
    with pytest.raises(ValidationError, match="divisible by patch_size\\*num_windows=32"):
        RFDETRNanoConfig(pretrain_weights=None, resolution=400)


def test_device_is_normalised():
    assert RFDETRNanoConfig(pretrain_weights=None, device=torch.device("cpu")).device == "cpu"
    assert RFDETRNanoConfig(pretrain_weights=None, device="cuda:0").device == "cuda:0"


def test_random_weights_and_architecture_changes_warn():
    with pytest.warns(PretrainWeightsCompatibilityWarning, match="random weights"):
        RFDETRNanoConfig(pretrain_weights=None)
    with pytest.warns(PretrainWeightsCompatibilityWarning, match="dec_layers"):
        RFDETRNanoConfig(dec_layers=5)
    with pytest.warns(PretrainWeightsCompatibilityWarning, match="mask_downsample_ratio"):
        RFDETRSegNanoConfig(mask_downsample_ratio=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RFDETRNanoConfig()  # the published defaults themselves do not warn
        RFDETRSegNanoConfig()
        RFDETRNanoConfig(mask_downsample_ratio=2)  # no mask head: nothing to differ from
        ModelConfig()  # a custom model has no published weights to differ from


def test_unavailable_features_raise_not_implemented(tiny_kwargs):
    with pytest.raises(NotImplementedError, match="two_stage"):
        RFDETRSmall(**tiny_kwargs, two_stage=False)


def test_acceleration_is_planned_at_train_start_not_at_construction(tiny_kwargs, caplog):
    """compile and cuda_graphs are decided once per run, from the configs and the device."""
    from detrkit.config import TrainConfig
    from detrkit.training.trainer import plan_run

    with caplog.at_level("INFO", logger="detrkit"):
        model = RFDETRNano(**tiny_kwargs, compile=True, cuda_graphs=True)
    assert "compile" not in caplog.text
    with caplog.at_level("INFO", logger="detrkit"):
        plan = plan_run(model.model_config, TrainConfig(dataset_dir=None, accelerator="cpu"), {})
    assert plan.cuda_graphs is None and plan.fp8_backend is None and plan.precision == "32-true"
    assert "CUDA graphs" in caplog.text


def test_train_config_checkpoint_and_ema_settings():
    from detrkit.config import TrainConfig

    config = TrainConfig(dataset_dir=None)
    assert (config.use_ema, config.ema_decay, config.ema_tau, config.checkpoint_interval) == (True, 0.993, 100, 10)
    assert (config.early_stopping, config.early_stopping_patience, config.early_stopping_min_delta) == (False, 10, 0.001)
    assert config.best_model_metric == "map" and config.resume is None
    with pytest.raises(ValidationError, match="early_stopping_use_ema=True needs use_ema=True"):
        TrainConfig(dataset_dir=None, use_ema=False, early_stopping_use_ema=True)
    with pytest.raises(ValidationError, match="best_model_metric"):
        TrainConfig(dataset_dir=None, best_model_metric="f1")
    with pytest.raises(ValidationError, match="checkpoint_interval"):
        TrainConfig(dataset_dir=None, checkpoint_interval=0)
