"""training_config.json: what a run was asked to do, written atomically at its start and end."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from detrkit.config import ModelConfig, TrainConfig


def write_json_atomically(path: Path, payload: dict) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream, indent=2)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_training_config(train_config: TrainConfig, model_config: ModelConfig, class_names: list[str]) -> Path:
    path = Path(train_config.output_dir) / "training_config.json"
    write_json_atomically(path, {
        "train_config": train_config.model_dump(mode="json"),
        "model_config": model_config.model_dump(mode="json"),
        "model_config_type": type(model_config).__name__,
        "class_names": class_names,
        "num_classes": len(class_names),
    })
    return path
