"""Convert an exported ONNX file to OpenVINO IR (fp32, fp16 or NNCF int8) and run IR files on OpenVINO's CPU plugin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detrkit.export.onnx import METADATA_KEY


def convert_to_openvino(onnx_path: Path, xml_path: Path, metadata: dict[str, Any], half: bool = False,
                        calibration: list[torch.Tensor] | None = None) -> Path:
    """OpenVINO IR (`xml_path` and its .bin) of an ONNX file, with `metadata` as rt_info["detrkit"].
    `half` stores the weights in fp16 (inference still computes in fp32, see OpenVinoRunner);
    `calibration` (normalised batches) quantizes it to int8 with NNCF's post-training quantization
    (transformer preset: int8 matmuls and convolutions, softmax and normalisation left in fp32)."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    if calibration is not None:
        import nncf

        samples = nncf.Dataset([batch.numpy() for batch in calibration])
        model = nncf.quantize(model, samples, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration))
        metadata = metadata | {"quantize": "int8"}
    model.set_rt_info(json.dumps(metadata), [METADATA_KEY])
    ov.save_model(model, str(xml_path), compress_to_fp16=half)
    return xml_path


def read_openvino_metadata(path: Path) -> dict[str, Any]:
    import openvino as ov

    model = ov.Core().read_model(str(path))
    if not model.has_rt_info([METADATA_KEY]):
        raise ValueError(f"{path} has no detrkit metadata: export it with detrkit (model.export) to run it here")
    return json.loads(model.get_rt_info([METADATA_KEY]).astype(str))


class OpenVinoRunner:
    """A compiled OpenVINO model: normalised pixels -> outputs by name.

    The CPU plugin would compute in bf16 on CPUs that have it (its default precision hint), which
    changes the scores; the precision hint is pinned to fp32, so the file's numbers are the model's.
    """

    def __init__(self, path: Path, threads: int | None = None, device: str = "CPU") -> None:
        import openvino as ov

        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(path)), device, config)
        self.names = [output.get_any_name() for output in self.compiled.outputs]

    def __call__(self, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
        results = self.compiled(np.ascontiguousarray(pixels.cpu().numpy()))
        return {name: torch.from_numpy(np.asarray(results[output]))
                for name, output in zip(self.names, self.compiled.outputs)}
