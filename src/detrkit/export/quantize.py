"""INT8 ONNX files by onnxruntime's static quantization, calibrated on images through predict()'s pre-processing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from detrkit.export.onnx import METADATA_KEY

# the products carry nearly all of the FLOPs; the rest (normalisation, softmax, sampling) stays fp32
QUANTIZED_OPS = ["MatMul", "Conv", "Gemm"]


def quantize_onnx(source: Path, target: Path, calibration: list[torch.Tensor], metadata: dict[str, Any]) -> Path:
    """Write `target`: `source` with int8 weights (per channel, symmetric) and uint8 activations in
    QDQ form, the activation ranges calibrated on `calibration` (normalised (1, C, H, W) batches;
    min-max ranges). The metadata is stored again, with "quantize": "int8"."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches: Iterator[torch.Tensor] = iter(calibration)

        def get_next(self) -> dict | None:
            batch = next(self.batches, None)
            return None if batch is None else {"pixels": batch.numpy()}

    quantize_static(str(source), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=QUANTIZED_OPS)
    model = onnx.load(str(target))
    del model.metadata_props[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata | {"quantize": "int8"})
    onnx.save(model, str(target))
    return target
