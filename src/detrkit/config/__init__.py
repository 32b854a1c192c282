"""Validated settings, read only by builders: ModelConfig (the detector) and TrainConfig (a run).

Unknown keys raise pydantic's ValidationError naming the key and its closest valid spellings.
"""

from detrkit.config.base import (DeviceStr, PathStr, StrictConfig, default_device, device_string, path_string,
                                 unknown_keyword_message)
from detrkit.config.model import (ENCODER_SIZES, AmpDtype, EncoderName, InferenceDtype, ModelConfig,
                                  PretrainWeightsCompatibilityWarning, ProjectorLevel)
from detrkit.config.train import (MANAGED_OPTIMIZER_KWARGS, MANAGED_SCHEDULE_KWARGS, MANAGED_SCHEDULES,
                                  AugmentationBackend, CocoEvalBackend, DatasetFormat, KeypointTrainConfig, MultiScale,
                                  SegmentationTrainConfig, TrainConfig,
                                  is_plateau_scheduler, native_optimizer)

__all__ = [
    "ENCODER_SIZES", "MANAGED_OPTIMIZER_KWARGS", "MANAGED_SCHEDULES", "MANAGED_SCHEDULE_KWARGS", "AmpDtype",
    "AugmentationBackend", "CocoEvalBackend", "DatasetFormat", "DeviceStr", "EncoderName", "InferenceDtype", "KeypointTrainConfig",
    "ModelConfig", "MultiScale", "PathStr", "PretrainWeightsCompatibilityWarning", "ProjectorLevel", "SegmentationTrainConfig",
    "StrictConfig",
    "TrainConfig", "default_device", "device_string", "is_plateau_scheduler", "native_optimizer", "path_string",
    "unknown_keyword_message",
]
