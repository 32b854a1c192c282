"""Write a DeployGraph to an ONNX file with detrkit's metadata, and run such files on onnxruntime."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detrkit.models.deploy_graph import DeployGraph

logger = logging.getLogger(__name__)

METADATA_KEY = "detrkit"  # metadata_props key whose value is the JSON of export metadata
DEFAULT_OPSET = 17  # GridSample (deformable attention's sampling) needs 16 or later


def export_onnx(graph: DeployGraph, path: Path, example: torch.Tensor, metadata: dict[str, Any],
                dynamic_batch: bool = False, opset: int = DEFAULT_OPSET, simplify: bool = True,
                half: bool = False) -> Path:
    """Trace `graph` on `example` (B, C, H, W) into `path` (written whole or not at all).

    The input is named "pixels"; the outputs are graph.names. `dynamic_batch` leaves the batch
    axis free; H and W stay the example's. Deformable attention becomes GridSample, so runtimes
    need opset 16 or later. `simplify` runs onnxslim (constant folding, dead-node removal) when it
    is installed, and says when it is not. `half` stores the network in fp16 (onnxconverter-common),
keeping the float32 input and outputs and the post-processing's ops in fp32. `metadata` is stored as JSON under metadata_props["detrkit"].
    """
    import onnx

    if opset < 16:
        raise ValueError(f"opset={opset}: deformable attention exports as GridSample, which needs opset 16 or later")
    axes = {name: {0: "batch"} for name in ["pixels", *graph.names]} if dynamic_batch else None
    partial = path.with_name(path.name + ".partial")
    graph.eval()
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings on shape arithmetic that is constant for one size
        torch.onnx.export(graph, (example,), str(partial), input_names=["pixels"], output_names=graph.names,
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)
    model = onnx.load(str(partial))
    if simplify:
        model = _simplified(model)
    if half:
        model = _half(model)
    del model.metadata_props[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
    onnx.save(model, str(partial))
    partial.replace(path)
    return path


def _simplified(model):
    """onnxslim's simplification of `model`, or the model as it is when onnxslim is missing."""
    try:
        import onnxslim
    except ImportError:
        logger.info("simplify=True: onnxslim is not installed (pip install onnxslim); the graph is written "
                    "as exported, with constant folding only")
        return model
    return onnxslim.slim(model)


# kept in fp32 by the half conversion: the top-k selection and score arithmetic, and the ops whose
# fp16 kernels onnxruntime's CPU provider lacks (they would be wrapped in casts anyway)
_FP32_OPS = ["TopK", "Sigmoid", "Log", "Exp", "Softmax", "ReduceLogSumExp", "GridSample", "Resize"]


def _half(model):
    try:
        from onnxconverter_common import float16
    except ImportError as error:
        raise ImportError("half=True for ONNX needs onnxconverter-common: pip install onnxconverter-common") from error
    _separate_outputs(model)
    return float16.convert_float_to_float16(model, keep_io_types=True,
                                            op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, *_FP32_OPS])


def _separate_outputs(model) -> None:
    """Give each graph output that other nodes also read its own Identity node: the fp16
    converter mistypes such shared tensors (pred_logits feeds the top-k and is an output)."""
    import onnx

    read = {name for node in model.graph.node for name in node.input}
    for output in model.graph.output:
        if output.name in read:
            inner = f"{output.name}__inner"
            for node in model.graph.node:
                node.output[:] = [inner if name == output.name else name for name in node.output]
                node.input[:] = [inner if name == output.name else name for name in node.input]
            model.graph.node.append(onnx.helper.make_node("Identity", [inner], [output.name],
                                                          name=f"{output.name}__output"))


def read_onnx_metadata(path: Path) -> dict[str, Any]:
    """The metadata export_onnx stored in `path`; a clear error when the file holds none."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            return json.loads(entry.value)
    raise ValueError(f"{path} has no detrkit metadata: export it with detrkit (model.export) to run it here")


class OnnxRunner:
    """An onnxruntime session over an exported file: normalised pixels -> outputs by name."""

    def __init__(self, path: Path, threads: int | None = None, providers: list[str] | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])
        self.names = [output.name for output in self.session.get_outputs()]

    def __call__(self, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
        arrays = self.session.run(self.names, {"pixels": np.ascontiguousarray(pixels.cpu().numpy())})
        return {name: torch.from_numpy(array) for name, array in zip(self.names, arrays)}
