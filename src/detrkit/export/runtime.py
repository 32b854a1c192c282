"""ExportedModel: predict() on an exported ONNX or OpenVINO file, through the PyTorch model's own pre- and post-processing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from detrkit.predictor import Predictor

# file suffix -> the format's name, as export() writes them
FORMATS = {".onnx": "onnx", ".xml": "openvino"}


class ExportedModel(Predictor):
    """An exported detector: `predict()` takes the same sources and keywords as RFDETR.predict and
    returns the same `supervision.Detections` (or KeyPoints); `shape` may only be the export's size.

    `threads` caps the runtime's CPU threads (default: the runtime's own choice). Files exported
    with `raw=True` hold the heads' raw outputs and cannot predict here (post-process them yourself).
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"exported model not found: {self.path}")
        self.format = FORMATS.get(self.path.suffix.lower())
        if self.format is None:
            raise ValueError(f"{self.path}: unknown export format {self.path.suffix!r}; expected one of {sorted(FORMATS)}")
        if self.format == "onnx":
            from detrkit.export.onnx import OnnxRunner, read_onnx_metadata

            self.metadata: dict[str, Any] = read_onnx_metadata(self.path)
            self._runner = OnnxRunner(self.path, threads)
        else:
            from detrkit.export.openvino import OpenVinoRunner, read_openvino_metadata

            self.metadata = read_openvino_metadata(self.path)
            self._runner = OpenVinoRunner(self.path, threads)
        self.class_names = self.metadata["class_names"]
        self._preparers = {}

    @property
    def num_classes(self) -> int:
        return self.metadata["num_classes"]

    @property
    def _channels(self) -> int:
        return self.metadata["num_channels"]

    @property
    def _block_size(self) -> int:
        return self.metadata["block_size"]

    @property
    def _default_size(self) -> tuple[int, int]:
        return tuple(self.metadata["input_size"])

    @property
    def _device(self) -> torch.device:
        return torch.device("cpu")

    def _preparer(self, shape: tuple[int, int] | None):
        if shape is not None and tuple(shape) != self._default_size:
            raise ValueError(f"shape={shape}: {self.path.name} was exported for input size {self._default_size} (H, W)")
        return super()._preparer(None)

    def _run_graph(self, pixels: torch.Tensor, raw: bool = False) -> dict[str, torch.Tensor]:
        """Outputs by name; a fixed-batch file runs the batch in pieces of its size. `raw` says
        which outputs the caller expects: the file's must be those."""
        if self.metadata["raw"] != raw:
            kind = "the heads' own" if self.metadata["raw"] else "post-processed"
            raise ValueError(f"{self.path.name} holds {kind} outputs ({', '.join(self.metadata['outputs'])}); "
                             f"predict() needs a file exported without raw=True")
        step = self.metadata["batch_size"]
        if step == "dynamic" or len(pixels) == step:
            return self._runner(pixels)
        count = len(pixels)
        short = -count % step  # the last piece is padded with copies of the last image
        padded = torch.cat([pixels, pixels[-1:].expand(short, *pixels.shape[1:])]) if short else pixels
        parts = [self._runner(padded[start:start + step]) for start in range(0, len(padded), step)]
        return {name: torch.cat([part[name] for part in parts])[:count] for name in parts[0]}


def load_exported(path: str | os.PathLike, threads: int | None = None) -> ExportedModel:
    """An ExportedModel over `path` (.onnx or OpenVINO .xml), read and checked now."""
    return ExportedModel(path, threads)
