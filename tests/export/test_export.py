"""export(): ONNX and OpenVINO files of tiny detection, segmentation and keypoint models predict as the
PyTorch model does, carry their metadata, and a broken export is caught by the accuracy check."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from detrkit import RFDETRKeypointPreview, RFDETRNano, RFDETRSegNano
from detrkit.cli import main
from detrkit.datasets.synthetic import make_synthetic_dataset, synthetic_images
from detrkit.export import ExportAccuracyError, load_exported
from detrkit.export import writer
from detrkit.export.check import check_export
from detrkit.export.onnx import read_onnx_metadata
from detrkit.models.postprocess import ordered_topk

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

SEGMENT = {"patch_size": 16, "num_windows": 2}
POSE = dict(use_grouppose_keypoints=True, dual_projector=True, dual_projector_kp_only=True,
            num_keypoints_per_class=[4, 2, 4], patch_size=16, num_windows=2, num_classes=3)
TASKS = {"detect": (RFDETRNano, {}), "segment": (RFDETRSegNano, SEGMENT), "pose": (RFDETRKeypointPreview, POSE)}


def build(task: str, tiny_kwargs: dict, seed: int = 0):
    cls, extra = TASKS[task]
    torch.manual_seed(seed)
    model = cls(**{**tiny_kwargs, **extra})
    model.class_names = [f"class{i}" for i in range(model.num_classes)]
    return model


def images(count: int = 3):
    return synthetic_images(count, (100, 80), seed=5)  # not the model's square size: the boxes get rescaled


def assert_same_predictions(ours, theirs, atol: float = 1e-4):
    for a, b in zip(ours, theirs, strict=True):
        if hasattr(a, "xy"):  # KeyPoints
            np.testing.assert_allclose(b.xy, a.xy, atol=atol)
            np.testing.assert_allclose(b.keypoint_confidence, a.keypoint_confidence, atol=1e-5)
            np.testing.assert_allclose(b.data["xyxy"], a.data["xyxy"], atol=atol)
            continue
        assert len(a) == len(b) > 0
        np.testing.assert_array_equal(b.class_id, a.class_id)
        np.testing.assert_allclose(b.xyxy, a.xyxy, atol=atol)
        np.testing.assert_allclose(b.confidence, a.confidence, atol=1e-5)
        assert list(b.data["class_name"]) == list(a.data["class_name"])
        if a.mask is not None:
            assert b.mask.shape == a.mask.shape == (len(a), 80, 100)
            assert (b.mask != a.mask).mean() < 1e-3


@pytest.mark.parametrize("task", list(TASKS))
def test_onnx_file_predicts_as_the_pytorch_model(task, tiny_kwargs, tmp_path):
    model = build(task, tiny_kwargs)
    path = model.export(output_dir=tmp_path)
    assert path == tmp_path / "inference_model.onnx" and path.is_file()
    report = json.loads((tmp_path / "inference_model.onnx.check.json").read_text())
    assert report["passed"] and report["compared"] == 80 and report["matched"] == 80  # 8 images x top 10
    assert report["max_abs_diff"]["pred_logits"] < 1e-4
    assert not list(tmp_path.glob(".export-*"))  # the scratch folder is gone
    exported = load_exported(path, threads=1)
    assert_same_predictions(model.predict(images(), threshold=0.0), exported.predict(images(), threshold=0.0))


def test_openvino_file_predicts_as_the_pytorch_model(tiny_kwargs, tmp_path):
    pytest.importorskip("openvino")
    model = build("segment", tiny_kwargs)
    path = model.export("openvino", tmp_path)
    assert path.suffix == ".xml" and path.with_suffix(".bin").is_file()
    assert not (tmp_path / "inference_model.onnx").exists()  # the intermediate ONNX file stays in scratch
    exported = load_exported(path)
    assert exported.metadata["format"] == "openvino"
    assert_same_predictions(model.predict(images(), threshold=0.0), exported.predict(images(), threshold=0.0))


def test_gather_sampling_exports_without_grid_sample_and_predicts_the_same(tiny_kwargs, tmp_path):
    model = build("segment", tiny_kwargs)
    path = model.export(output_dir=tmp_path, sampling="gather")
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "GridSample" not in ops and "GatherElements" in ops
    assert {m.sampling for m in model.model.modules() if hasattr(m, "sampling")} == {"grid_sample"}  # untouched
    exported = load_exported(path)
    assert exported.metadata["sampling"] == "gather"
    assert_same_predictions(model.predict(images(), threshold=0.0), exported.predict(images(), threshold=0.0))


@pytest.mark.parametrize("batch_size", ["dynamic", 2])
def test_batches_of_any_length_run_on_dynamic_and_fixed_batch_files(batch_size, tiny_kwargs, tmp_path):
    model = build("detect", tiny_kwargs)
    exported = load_exported(model.export(output_dir=tmp_path, batch_size=batch_size))
    for count in (1, 3):  # 3 images on a batch-2 file: two runs, the second padded
        assert_same_predictions(model.predict(images(count), threshold=0.0),
                                exported.predict(images(count), threshold=0.0, batch=count))


def test_metadata_describes_the_model_and_its_post_processing(tiny_kwargs, tmp_path):
    model = build("pose", tiny_kwargs)
    meta = read_onnx_metadata(model.export(output_dir=tmp_path, batch_size="dynamic"))
    assert meta["variant"] == "RFDETRKeypointPreview" and meta["class_names"] == ["class0", "class1", "class2"]
    assert meta["input_size"] == [64, 64] and meta["batch_size"] == "dynamic" and meta["opset"] == 17
    assert meta["mean"] == [0.485, 0.456, 0.406] and meta["std"] == [0.229, 0.224, 0.225]
    assert meta["num_keypoints_per_class"] == [4, 2, 4] and meta["num_select"] == 12
    assert meta["outputs"] == ["boxes", "scores", "labels", "keypoints", "keypoint_precision_cholesky",
                               "pred_logits", "pred_boxes"]
    assert meta["detrkit_version"] == __import__("detrkit").__version__


def test_raw_export_returns_the_heads_outputs(tiny_kwargs, tmp_path):
    model = build("segment", tiny_kwargs)
    path = model.export(output_dir=tmp_path, raw=True)
    exported = load_exported(path)
    assert exported.metadata["outputs"] == ["pred_logits", "pred_boxes", "pred_masks"]
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = model.model.eval()(pixels)
    got = exported._run_graph(pixels, raw=True)
    for name in ("pred_logits", "pred_boxes", "pred_masks"):
        torch.testing.assert_close(got[name], expected[name], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="exported without raw=True"):
        exported.predict(images(1))


def _perturb_box_head(path) -> None:
    """Add unit noise to the final box layer's weight (a 2-D initializer) in an ONNX file, as a
    broken conversion would: the boxes move."""
    model = onnx.load(str(path))
    (init,) = [i for i in model.graph.initializer if "bbox_embed/layers.2" in i.name and len(i.dims) == 2]
    noise = np.random.default_rng(0).normal(size=tuple(init.dims)).astype(np.float32)
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + noise, init.name))
    onnx.save(model, str(path))


def test_a_broken_export_is_caught_and_not_written(tiny_kwargs, tmp_path, monkeypatch):
    model = build("detect", tiny_kwargs)
    first = model.export(output_dir=tmp_path)
    before = first.read_bytes()
    real = writer.export_onnx

    def broken(*args, **kwargs):
        path = real(*args, **kwargs)
        _perturb_box_head(path)
        return path

    monkeypatch.setattr(writer, "export_onnx", broken)
    with pytest.raises(ExportAccuracyError, match="FAILED: matched"):
        model.export(output_dir=tmp_path)
    assert first.read_bytes() == before  # the earlier export and its report are untouched
    assert json.loads((tmp_path / "inference_model.onnx.check.json").read_text())["passed"]
    report = json.loads((tmp_path / "inference_model.onnx.failed-check.json").read_text())
    assert not report["passed"] and report["matched_fraction"] < 0.99
    assert not list(tmp_path.glob(".export-*"))
    model.export(output_dir=tmp_path / "kept", check=False)  # check=False keeps it
    assert (tmp_path / "kept" / "inference_model.onnx").is_file()


def test_check_compares_map_on_a_dataset_validation_split(tiny_kwargs, tmp_path):
    data = make_synthetic_dataset(tmp_path / "data", num_train=2, num_valid=4, image_size=(64, 64), seed=0)
    model = build("detect", {**tiny_kwargs, "num_classes": 3})
    model.export(output_dir=tmp_path / "out", dataset_dir=data)
    report = json.loads((tmp_path / "out" / "inference_model.onnx.check.json").read_text())
    assert report["images"] == 4 and report["passed"]
    assert report["map_pytorch"] == pytest.approx(report["map_exported"], abs=1e-6)


def test_check_of_a_perturbed_file_fails(tiny_kwargs, tmp_path):
    model = build("detect", tiny_kwargs)
    path = model.export(output_dir=tmp_path, check=False)
    _perturb_box_head(path)
    report = check_export(model, load_exported(path), images(4))
    assert not report.passed and report.max_abs_diff["pred_boxes"] > 0.1
    assert "FAILED" in report.table()


def test_half_export_goes_through_the_check(tiny_kwargs, tmp_path):
    pytest.importorskip("onnxconverter_common")
    model = build("detect", tiny_kwargs)
    path = model.export(output_dir=tmp_path, half=True, check=False)
    inits = onnx.load(str(path)).graph.initializer
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in inits)
    report = check_export(model, load_exported(path), images(4))
    # fp16 rounding shows (the encoder's query selection may flip too: the check then reports it)
    assert 0 < report.max_abs_diff["pred_logits"] < 10 and report.compared == 40


def test_exported_top_k_keeps_ties_in_index_order(tmp_path):
    class TopK(nn.Module):
        def forward(self, values):
            return ordered_topk(values, 5)

    values = torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1, 0.5, 0.9, 0.2]])
    path = tmp_path / "topk.onnx"
    torch.onnx.export(TopK(), (values,), str(path), input_names=["v"], output_names=["s", "i"], dynamo=False)
    import onnxruntime as ort

    scores, index = ort.InferenceSession(str(path)).run(None, {"v": values.numpy()})
    assert index.tolist() == [[1, 3, 6, 0, 2]] == ordered_topk(values, 5)[1].tolist()


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "tensorrt"}, "exports 'onnx' or 'openvino'"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"opset": 13}, "opset=13"),
    ({"opset": 17, "opset_version": 16}, "disagree"),
    ({"sampling": "nearest"}, "sampling='nearest'"),
])
def test_bad_export_arguments_are_refused_before_anything_is_written(kwargs, message, tiny_kwargs, tmp_path):
    with pytest.raises(ValueError, match=message):
        build("detect", tiny_kwargs).export(output_dir=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "inference_model.onnx").exists()


def test_runtime_errors_name_the_file(tiny_kwargs, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        load_exported(tmp_path / "missing.onnx")
    (tmp_path / "model.trt").write_bytes(b"")
    with pytest.raises(ValueError, match="unknown export format"):
        load_exported(tmp_path / "model.trt")
    plain = tmp_path / "plain.onnx"
    torch.onnx.export(nn.Linear(2, 2), (torch.zeros(1, 2),), str(plain), dynamo=False)
    with pytest.raises(ValueError, match="plain.onnx has no detrkit metadata"):
        load_exported(plain)
    exported = load_exported(build("detect", tiny_kwargs).export(output_dir=tmp_path / "out"))
    with pytest.raises(ValueError, match=r"exported for input size \(64, 64\)"):
        exported.predict(images(1), shape=(128, 128))


def test_cli_exports_a_checkpoint(tiny_kwargs, tmp_path, capsys):
    model = build("detect", tiny_kwargs)
    checkpoint = tmp_path / "model.pth"
    torch.save({"model": model.model.state_dict(), "model_name": "RFDETRNano",
                "model_config": model.model_config.model_dump()}, checkpoint)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "out"),
                 "--batch-size", "dynamic"]) == 0
    out = capsys.readouterr().out
    assert "result" in out and "passed" in out and "exported to" in out
    assert read_onnx_metadata(tmp_path / "out" / "inference_model.onnx")["batch_size"] == "dynamic"


def test_int8_export_quantizes_the_products_and_goes_through_the_check(tiny_kwargs, tmp_path):
    pytest.importorskip("onnxruntime.quantization")
    data = make_synthetic_dataset(tmp_path / "data", num_train=3, num_valid=2, image_size=(64, 64), seed=0)
    model = build("detect", {**tiny_kwargs, "num_classes": 3})
    path = model.export(output_dir=tmp_path / "out", quantize="int8", dataset_dir=data, check=False,
                        batch_size=2)  # 3 calibration images in batches of 2: the first one again
    graph = onnx.load(str(path)).graph
    ops = {node.op_type for node in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert any(init.data_type == onnx.TensorProto.INT8 for init in graph.initializer)
    exported = load_exported(path)
    assert exported.metadata["quantize"] == "int8" and not (tmp_path / "out" / "fp32.onnx").exists()
    report = check_export(model, exported, images(2), batch=2)
    assert 0 < report.max_abs_diff["pred_logits"] < 10 and report.compared == 20  # int8 rounding shows


def test_openvino_int8_export_is_quantized_by_nncf_and_goes_through_the_check(tiny_kwargs, tmp_path):
    pytest.importorskip("nncf")
    ov = pytest.importorskip("openvino")
    data = make_synthetic_dataset(tmp_path / "data", num_train=3, num_valid=2, image_size=(64, 64), seed=0)
    model = build("detect", {**tiny_kwargs, "num_classes": 3})
    path = model.export("openvino", tmp_path / "out", quantize="int8", dataset_dir=data, check=False)
    ops = {node.get_type_name() for node in ov.Core().read_model(str(path)).get_ops()}
    assert "FakeQuantize" in ops and not (tmp_path / "out" / "inference_model.onnx").exists()
    exported = load_exported(path)
    assert exported.metadata["quantize"] == "int8"
    report = check_export(model, exported, images(2))
    assert 0 < report.max_abs_diff["pred_logits"] < 10 and report.compared == 20  # int8 rounding shows


@pytest.mark.parametrize("kwargs", [{"quantize": "int4"}, {"quantize": "int8", "raw": True},
                                    {"quantize": "int8", "half": True}])
def test_unsupported_quantization_is_refused(kwargs, tiny_kwargs, tmp_path):
    with pytest.raises(ValueError, match="quantize"):
        build("detect", tiny_kwargs).export(output_dir=tmp_path, **kwargs)
