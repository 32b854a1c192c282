"""export(): write an exported file, check its accuracy against the PyTorch model, and keep it only if it passes."""

from __future__ import annotations

import copy
import logging
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch

from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD, read_image, to_tensor
from detrkit.datasets.synthetic import synthetic_images
from detrkit.export.check import CheckReport, ExportAccuracyError, check_export
from detrkit.export.onnx import DEFAULT_OPSET, export_onnx
from detrkit.models.deform_attn import MSDeformAttn
from detrkit.models.deploy_graph import DeployGraph
from detrkit.ops.deformable import SAMPLERS
from detrkit.version import __version__

logger = logging.getLogger(__name__)

ExportFormat = Literal["onnx", "openvino"]
FILE_STEM = "inference_model"  # rfdetr's name for the exported file
SYNTHETIC_CHECK_IMAGES = 8


def export_model(model, format: ExportFormat = "onnx", output_dir: str | Path = "output",
                 batch_size: int | Literal["dynamic"] = 1, opset: int = DEFAULT_OPSET, half: bool = False,
                 simplify: bool = True, raw: bool = False, check: bool = True, dataset_dir: str | Path | None = None,
                 threshold: float = 0.5, map_tolerance: float = 0.5, min_matched: float = 0.99,
                 check_images: int = 100, quantize: Literal["int8"] | None = None,
                 calibration_images: int = 32, sampling: str = "grid_sample") -> Path:
    """Export an RFDETR `model` (see RFDETR.export for the arguments) and return the file's path.

    The file is built in a scratch folder, checked there, and moved into `output_dir` only when
    the check passes (or `check=False`), so an earlier export there is never half-overwritten.
    The check's table is printed and written to `<file>.check.json` in `output_dir`, or to
    `<file>.failed-check.json` when it fails.
    """
    if format not in ("onnx", "openvino"):
        raise ValueError(f"format={format!r}: detrkit exports 'onnx' or 'openvino'")
    if batch_size != "dynamic" and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r}: a positive int or 'dynamic'")
    if opset < 16:
        raise ValueError(f"opset={opset}: deformable attention exports as GridSample, which needs opset 16 or later")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize={quantize!r}: detrkit quantizes to 'int8' (or None)")
    if quantize and (half or raw):
        raise ValueError("quantize='int8' works on post-processed fp32 exports only (half=False, raw=False)")
    if sampling not in SAMPLERS:
        raise ValueError(f"sampling={sampling!r}: one of {sorted(SAMPLERS)}")
    images, truth = _check_set(model, dataset_dir, check_images) if check else ([], None)
    calibration = _calibration_set(model, dataset_dir, calibration_images, batch_size) if quantize else None
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    suffix = ".onnx" if format == "onnx" else ".xml"
    final = output / f"{FILE_STEM}{suffix}"
    with tempfile.TemporaryDirectory(prefix=".export-", dir=output) as scratch:
        staged = _write(model, Path(scratch), format, batch_size, opset, half, simplify, raw, calibration, sampling)
        if check:
            report = _check(model, staged, images, truth, threshold, map_tolerance, min_matched, raw, batch_size)
            print(f"export check of {final}:\n{report.table()}")
            if not report.passed:  # its report goes beside, not over, the report of a file already there
                written = report.write(output / f"{final.name}.failed-check.json")
                raise ExportAccuracyError(f"the export to {final} failed its accuracy check, so it was not written "
                                          f"(report: {written}; check=False keeps it anyway):\n{report.table()}")
            report.write(output / f"{final.name}.check.json")
        for path in Path(scratch).glob(f"{FILE_STEM}.*"):
            if format == "onnx" or path.suffix in (".xml", ".bin"):
                path.replace(output / path.name)
    logger.info("exported %s to %s", type(model).__name__, final)
    return final


def _write(model, folder: Path, format: ExportFormat, batch_size, opset: int, half: bool, simplify: bool,
           raw: bool, calibration: list[torch.Tensor] | None = None, sampling: str = "grid_sample") -> Path:
    """The exported file in `folder`; with `calibration` batches, the int8 file (the fp32 ONNX one
    it comes from stays in `folder` under another name)."""
    config = model.model_config
    detector = model.model
    if detector.class_embed.weight.device.type != "cpu" or sampling != MSDeformAttn.sampling:
        detector = copy.deepcopy(detector).cpu()  # the user's model stays as it is, on its device
        for module in detector.modules():
            if isinstance(module, MSDeformAttn):
                module.sampling = sampling
    graph = DeployGraph(detector.eval(), config.num_select, config.num_keypoints_per_class,
                        config.postprocess_trace_alpha, raw=raw)
    size = (config.resolution, config.resolution)
    example = torch.zeros(1 if batch_size == "dynamic" else batch_size, config.num_channels, *size)
    metadata = export_metadata(model, graph, size, batch_size, opset, half, format) | {"sampling": sampling}
    name = "fp32.onnx" if calibration is not None and format == "onnx" else f"{FILE_STEM}.onnx"
    onnx_path = export_onnx(graph, folder / name, example, metadata,
                            dynamic_batch=batch_size == "dynamic", opset=opset, simplify=simplify,
                            half=half and format == "onnx")
    if calibration is not None and format == "onnx":
        from detrkit.export.quantize import quantize_onnx

        return quantize_onnx(onnx_path, folder / f"{FILE_STEM}.onnx", calibration, metadata)
    if format == "onnx":
        return onnx_path
    from detrkit.export.openvino import convert_to_openvino

    return convert_to_openvino(onnx_path, folder / f"{FILE_STEM}.xml", metadata, half=half, calibration=calibration)


def export_metadata(model, graph: DeployGraph, size: tuple[int, int], batch_size, opset: int, half: bool,
                    format: ExportFormat) -> dict[str, Any]:
    """What an exported file says about itself (stored in it, read by ExportedModel)."""
    config = model.model_config
    channels = config.num_channels
    return {
        "detrkit_version": __version__, "variant": type(model).__name__, "format": format,
        "class_names": None if model.class_names is None else list(model.class_names),
        "num_classes": model.num_classes, "input_size": list(size), "num_channels": channels,
        "block_size": config.block_size, "batch_size": batch_size, "opset": opset, "half": half,
        "mean": [IMAGENET_MEAN[i % 3] for i in range(channels)], "std": [IMAGENET_STD[i % 3] for i in range(channels)],
        "input": "pixels (B, C, H, W) float32: RGB in [0, 1], resized bilinearly to input_size, minus mean, over std",
        "raw": graph.raw, "outputs": graph.names,
        "box_format": "xyxy, normalised by the input's width and height",
        "num_select": config.num_select, "num_keypoints_per_class": list(config.num_keypoints_per_class),
        "postprocess_trace_alpha": config.postprocess_trace_alpha,
    }


def _check_set(model, dataset_dir, limit: int) -> tuple[list, list[dict] | None]:
    """The check's images: the first `limit` of the data set's validation split with their ground
    truth (boxes in source pixels), or the fixed synthetic images without any."""
    if dataset_dir is None:
        return synthetic_images(SYNTHETIC_CHECK_IMAGES), None
    from detrkit.config import TrainConfig
    from detrkit.datasets.detect import build_datasets

    splits = build_datasets(TrainConfig(dataset_dir=str(dataset_dir)), model.model_config, masks=False,
                            keypoints=False)
    images, truth = [], []
    for record in splits.valid.records[:limit]:
        image = read_image(record.path)
        scale = torch.tensor([image.width, image.height] * 2, dtype=torch.float32)
        images.append(image)
        truth.append({"boxes": torch.from_numpy(record.boxes) * scale, "labels": torch.from_numpy(record.labels),
                      "iscrowd": torch.from_numpy(record.iscrowd).long()})
    return images, truth


def _calibration_set(model, dataset_dir, count: int, batch_size) -> list[torch.Tensor]:
    """Normalised batches (of the file's batch size; 1 for dynamic) of the first `count` training
    images of `dataset_dir`, or of synthetic images without one (a poor calibration: said so)."""
    if dataset_dir is None:
        logger.warning("quantize='int8' without dataset_dir calibrates on synthetic shapes; pass dataset_dir= "
                       "to calibrate on your images")
        pictures = synthetic_images(count)
    else:
        from detrkit.config import TrainConfig
        from detrkit.datasets.detect import build_datasets

        splits = build_datasets(TrainConfig(dataset_dir=str(dataset_dir)), model.model_config, masks=False,
                                keypoints=False)
        pictures = [read_image(record.path) for record in splits.train.records[:count]]
    step = 1 if batch_size == "dynamic" else batch_size
    preparer = model._preparer(None)
    tensors = [to_tensor(picture, model._channels) for picture in pictures]
    tensors += tensors[: -len(tensors) % step]  # whole batches: the first images again
    return [preparer(tensors[start:start + step]).cpu() for start in range(0, len(tensors), step)]


def _check(model, staged: Path, images, truth, threshold, map_tolerance, min_matched, raw, batch_size) -> CheckReport:
    from detrkit.export.runtime import ExportedModel

    return check_export(model, ExportedModel(staged), images, threshold, min_matched, map_tolerance, truth,
                        num_classes=model.num_classes, raw=raw, batch=2 if batch_size == "dynamic" else batch_size)
