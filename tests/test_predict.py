"""Tests that predict() turns any supported image into Detections in source pixels (spec 10)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import supervision as sv
import torch
import torch.nn.functional as F
from PIL import Image

from detrkit import RFDETRNano
from detrkit.datasets.coco_categories import COCO_CATEGORIES
from detrkit.datasets.images import BatchPreparer, read_image, to_tensor
from detrkit.models.postprocess import top_detections

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
NAMES = ["cat", "dog", "fox", "owl", "eel"]


def tiny(kwargs: dict, seed: int = 0, **changes) -> RFDETRNano:
    torch.manual_seed(seed)
    return RFDETRNano(**{**kwargs, **changes})


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """HWC uint8 test image: smooth gradients plus noise, so resizing matters."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width]
    base = np.stack((rows * 255 / height, cols * 255 / width, (rows + cols) * 127 / (height + width)), -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def manual_predictions(model: RFDETRNano, image: np.ndarray, size: tuple[int, int] | None = None) -> list[tuple]:
    """The spec's pipeline, one (query, class) pair at a time: [(score, class, x1, y1, x2, y2)]."""
    height, width = image.shape[:2]
    size = size or (model.model_config.resolution,) * 2
    pixels = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    pixels = F.interpolate(pixels[None], size=size, mode="bilinear", align_corners=False, antialias=False)
    with torch.no_grad():
        out = model.model((pixels - MEAN) / STD)
    probs, boxes = out["pred_logits"][0].sigmoid(), out.pred_boxes[0]
    pairs = [(probs[q, c].item(), q, c) for q in range(probs.shape[0]) for c in range(probs.shape[1])]
    pairs.sort(key=lambda pair: -pair[0])
    rows = []
    for score, query, label in pairs[: model.model_config.num_select]:
        cx, cy, w, h = boxes[query].tolist()
        corners = [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height]
        limits = [width, height, width, height]
        rows.append((score, label, *[min(max(v, 0.0), hi) for v, hi in zip(corners, limits)]))
    return rows


def as_rows(detections: sv.Detections) -> np.ndarray:
    return np.column_stack((detections.confidence, detections.class_id, detections.xyxy))


def assert_same(got: sv.Detections, want: sv.Detections, atol: float) -> None:
    assert len(got) == len(want)
    np.testing.assert_allclose(got.xyxy, want.xyxy, atol=atol)
    np.testing.assert_allclose(got.confidence, want.confidence, atol=atol)
    np.testing.assert_array_equal(got.class_id, want.class_id)


# -- the pipeline ----------------------------------------------------------------------------


@pytest.mark.parametrize("height, width", [(50, 80), (120, 90), (64, 64)])
def test_predict_matches_the_manual_pipeline_in_source_pixels(tiny_kwargs, height, width):
    model = tiny(tiny_kwargs)
    image = photo(height, width)
    detections = model.predict(image, threshold=0.0)
    want = np.array(manual_predictions(model, image))
    assert isinstance(detections, sv.Detections)
    assert len(detections) == model.model_config.num_select
    np.testing.assert_allclose(as_rows(detections), want, atol=1e-4)
    assert (detections.xyxy >= 0).all()
    assert (detections.xyxy[:, [0, 2]] <= width).all() and (detections.xyxy[:, [1, 3]] <= height).all()
    assert detections.data["source_shape"].tolist() == [[height, width]] * len(detections)


def test_boxes_outside_the_image_are_clamped_to_it(tiny_kwargs):
    model = tiny(tiny_kwargs)
    with torch.no_grad():  # widen every box e^10-fold, far past all four image edges
        model.model.bbox_embed.layers[2].bias.copy_(torch.tensor([0.0, 0.0, 10.0, 10.0]))
    detections = model.predict(photo(50, 80), threshold=0.0)
    assert len(detections) == 12
    np.testing.assert_array_equal(detections.xyxy, np.tile([0.0, 0.0, 80.0, 50.0], (12, 1)))


def test_custom_shape_resizes_to_height_width(tiny_kwargs):
    model = tiny(tiny_kwargs)
    image = photo(70, 100)
    detections = model.predict(image, threshold=0.0, shape=(64, 96))
    np.testing.assert_allclose(as_rows(detections), np.array(manual_predictions(model, image, (64, 96))),
                               atol=1e-4)
    assert (detections.xyxy[:, [0, 2]] <= 100).all() and (detections.xyxy[:, [1, 3]] <= 70).all()


def test_predict_runs_one_query_group_even_if_left_in_training_mode(tiny_kwargs):
    model = tiny(tiny_kwargs)
    image = photo(50, 80)
    want = model.predict(image, threshold=0.0)
    model.model.train()
    got = model.predict(image, threshold=0.0)
    assert not model.model.training
    assert_same(got, want, atol=0)


# -- input kinds -----------------------------------------------------------------------------


def test_every_input_kind_gives_the_same_detections(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    image = photo(50, 80)
    path = tmp_path / "image.png"
    Image.fromarray(image).save(path)  # lossless
    want = model.predict(image, threshold=0.0)
    inputs = {
        "str path": str(path),
        "pathlib path": path,
        "PIL": Image.fromarray(image),
        "float tensor": torch.from_numpy(image).permute(2, 0, 1).float() / 255,
        "uint8 tensor": torch.from_numpy(image).permute(2, 0, 1),
    }
    for kind, value in inputs.items():
        got = model.predict(value, threshold=0.0)
        assert isinstance(got, sv.Detections), kind
        assert_same(got, want, atol=1e-5)


def test_uint8_and_float_images_agree(tiny_kwargs):
    model = tiny(tiny_kwargs)
    image = photo(120, 90, seed=3)
    as_float = torch.from_numpy(image).permute(2, 0, 1).double().div(255).float()
    assert_same(model.predict(as_float, threshold=0.0), model.predict(image, threshold=0.0), atol=1e-5)


def test_pil_images_of_other_modes_are_converted_to_rgb(tiny_kwargs):
    model = tiny(tiny_kwargs)
    gray = photo(50, 80)[:, :, 0]
    want = model.predict(np.repeat(gray[:, :, None], 3, axis=2), threshold=0.0)
    assert_same(model.predict(Image.fromarray(gray, mode="L"), threshold=0.0), want, atol=0)
    rgb = photo(50, 80, seed=1)
    rgba = Image.fromarray(np.concatenate((rgb, np.full((50, 80, 1), 7, np.uint8)), 2), mode="RGBA")
    assert_same(model.predict(rgba, threshold=0.0), model.predict(rgb, threshold=0.0), atol=0)


def test_a_list_is_one_batch_equal_to_one_call_per_image(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    images = [photo(50, 80, 0), photo(120, 90, 1), photo(64, 64, 2)]
    Image.fromarray(images[0]).save(tmp_path / "first.png")
    mixed = [tmp_path / "first.png", Image.fromarray(images[1]),
             torch.from_numpy(images[2]).permute(2, 0, 1).float() / 255]
    calls = []
    model.model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    batch = model.predict(mixed, threshold=0.0)
    assert calls == [3]
    assert isinstance(batch, list) and len(batch) == 3
    for got, image in zip(batch, images):
        assert_same(got, model.predict(image, threshold=0.0), atol=1e-4)
        assert got.data["source_shape"][0].tolist() == list(image.shape[:2])


def test_a_tuple_of_one_image_gives_a_list(tiny_kwargs):
    result = tiny(tiny_kwargs).predict((photo(40, 40),), threshold=0.0)
    assert isinstance(result, list) and len(result) == 1


# -- threshold and class names ---------------------------------------------------------------


def test_threshold_is_strict(tiny_kwargs):
    model = tiny(tiny_kwargs)
    image = photo(50, 80)
    everything = model.predict(image, threshold=0.0)
    assert len(everything) == 12 and (everything.confidence > 0).all()
    assert (np.diff(everything.confidence) <= 0).all()  # best first
    cut = float(everything.confidence[3])
    kept = model.predict(image, threshold=cut)
    assert (kept.confidence > cut).all()
    assert len(kept) == int((everything.confidence > cut).sum()) == 3
    assert_same(kept, everything[:3], atol=0)
    assert len(model.predict(image, threshold=1.0)) == 0


def test_default_threshold_is_one_half(tiny_kwargs):
    model = tiny(tiny_kwargs)
    with torch.no_grad():
        model.model.class_embed.bias[2] = 3.0  # sigmoid ~ 0.95 for class 2 everywhere
    detections = model.predict(photo(50, 80))
    assert len(detections) > 0
    assert (detections.confidence > 0.5).all()
    assert set(detections.class_id.tolist()) == {2}


@pytest.mark.parametrize("threshold, count", [(1.0, 0), (0.0, 12)], ids=["empty", "full"])
def test_empty_and_full_results_have_the_same_dtypes(tiny_kwargs, threshold, count):
    detections = tiny(tiny_kwargs).predict(photo(50, 80), threshold=threshold)
    assert len(detections) == count
    assert detections.xyxy.shape == (count, 4) and detections.xyxy.dtype == np.float32
    assert detections.confidence.shape == (count,) and detections.confidence.dtype == np.float32
    assert detections.class_id.shape == (count,) and detections.class_id.dtype == np.int64
    assert detections.data["class_name"].shape == (count,) and detections.data["class_name"].dtype == object
    assert detections.data["source_shape"].shape == (count, 2)
    assert detections.data["source_shape"].dtype == np.int64


def test_class_names_come_from_the_checkpoint_with_background_last(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    with torch.no_grad():  # make the background slot (id 5) and class 1 win for some queries
        source.model.class_embed.bias.copy_(torch.tensor([-9.0, 1.0, -9.0, -9.0, -9.0, 1.0]))
        source.model.class_embed.weight.normal_(0, 1.0)
    path = tmp_path / "named.pth"
    torch.save({"model": source.model.state_dict(),
                "args": argparse.Namespace(class_names=NAMES, num_queries=12, group_detr=3)}, path)
    model = RFDETRNano(**{**tiny_kwargs, "pretrain_weights": str(path)})
    detections = model.predict(photo(50, 80), threshold=0.0)
    names = detections.data["class_name"].tolist()
    assert names == [NAMES[c] if c < 5 else "__background__" for c in detections.class_id]
    assert {"dog", "__background__"} <= set(names)
    assert model.class_name(5) == "__background__"
    assert [model.class_name(i) for i in range(5)] == NAMES


def test_coco_pretrained_heads_name_raw_coco_ids(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs, num_classes=90)
    path = tmp_path / "coco.pth"
    torch.save({"model": source.model.state_dict(),
                "args": argparse.Namespace(class_names=list(COCO_CATEGORIES.values()))}, path)
    kwargs = {k: v for k, v in tiny_kwargs.items() if k != "num_classes"}
    model = RFDETRNano(**{**kwargs, "pretrain_weights": str(path)})
    assert model.model.num_classes == 90
    assert model.class_name(1) == "person"
    assert model.class_name(18) == "dog"
    assert model.class_name(89) == "hair drier"


def test_fine_tuned_names_win_over_coco_mapping(tiny_kwargs, tmp_path):
    """A model that keeps the COCO head but was given its own names uses them by index."""
    source = tiny(tiny_kwargs, num_classes=3)
    path = tmp_path / "ft.pth"
    torch.save({"model": source.model.state_dict(), "args": {"class_names": ["a", "b", "c"]}}, path)
    model = RFDETRNano(**{**{k: v for k, v in tiny_kwargs.items() if k != "num_classes"},
                          "pretrain_weights": str(path)})
    assert [model.class_name(i) for i in range(4)] == ["a", "b", "c", "__background__"]


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("low, high", [(-0.1, 0.5), (0.0, 1.5), (0.0, 255.0)])
def test_float_tensors_outside_unit_range_are_refused(tiny_kwargs, low, high):
    image = torch.full((3, 64, 64), 0.5)
    image[0, 0, 0], image[1, 1, 1] = low, high
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tiny(tiny_kwargs).predict(image)


@pytest.mark.parametrize("image", [
    torch.rand(4, 64, 64),
    torch.rand(1, 64, 64),
    torch.rand(64, 64, 3),
    torch.rand(1, 3, 64, 64),
    np.zeros((64, 64, 4), np.uint8),
    np.zeros((64, 64), np.uint8),
    np.zeros((64, 64, 3), np.float32),
], ids=["4ch", "1ch", "hwc-tensor", "batched", "rgba-array", "gray-array", "float-array"])
def test_wrong_layout_or_channels_are_refused(tiny_kwargs, image):
    with pytest.raises(ValueError):
        tiny(tiny_kwargs).predict(image)


@pytest.mark.parametrize("image", [42, b"bytes", {"image": 1}, None])
def test_unsupported_types_raise_type_error(tiny_kwargs, image):
    with pytest.raises(TypeError, match="unsupported image type"):
        tiny(tiny_kwargs).predict(image)


def test_missing_path_names_the_file(tiny_kwargs, tmp_path):
    path = tmp_path / "gone.jpg"
    with pytest.raises(FileNotFoundError, match=str(path)):
        tiny(tiny_kwargs).predict(str(path))
    with pytest.raises(FileNotFoundError, match=str(path)):
        tiny(tiny_kwargs).predict([photo(32, 32), path])


def test_a_file_that_is_not_an_image_names_the_file(tiny_kwargs, tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("not an image")
    with pytest.raises(ValueError, match=str(path)):
        tiny(tiny_kwargs).predict(path)


@pytest.mark.parametrize("shape", [(48, 64), (64, 48), (64, 40), (0, 64), (64,), (32, 64, 96)])
def test_shape_sides_must_be_multiples_of_the_block_size(tiny_kwargs, shape):
    model = tiny(tiny_kwargs)
    assert model.model_config.block_size == 32
    with pytest.raises(ValueError, match="32"):
        model.predict(photo(40, 40), shape=shape)


# -- the pieces: image decoding, batching, postprocess ---------------------------------------


def test_read_image_decodes_as_rgb(tmp_path):
    image = photo(20, 30)
    Image.fromarray(image).convert("L").save(tmp_path / "gray.png")
    decoded = read_image(tmp_path / "gray.png")
    assert decoded.mode == "RGB" and decoded.size == (30, 20)


def test_to_tensor_keeps_dtype_and_layout():
    image = photo(20, 30)
    tensor = to_tensor(image)
    assert tensor.dtype == torch.uint8 and tensor.shape == (3, 20, 30)
    assert torch.equal(tensor, torch.from_numpy(image).permute(2, 0, 1))
    floats = torch.rand(3, 5, 6)
    assert to_tensor(floats) is floats
    assert to_tensor(np.zeros((5, 6), np.uint8), channels=1).shape == (1, 5, 6)


def test_batch_preparer_resizes_without_antialias_and_normalises():
    image = torch.from_numpy(photo(50, 80)).permute(2, 0, 1)
    batch = BatchPreparer((32, 64), 3, torch.device("cpu"))([image, image.float() / 255])
    resized = F.interpolate(image[None].float() / 255, size=(32, 64), mode="bilinear", antialias=False)
    want = (resized[0] - MEAN) / STD
    assert batch.shape == (2, 3, 32, 64) and batch.dtype == torch.float32
    torch.testing.assert_close(batch[0], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[1], want, atol=1e-5, rtol=0)
    # an image already at the target size is only normalised
    same = BatchPreparer((50, 80), 3, torch.device("cpu"))([image])[0]
    torch.testing.assert_close(same, (image.float() / 255 - MEAN) / STD, atol=1e-6, rtol=0)


def test_top_detections_ranks_pairs_and_scales_boxes_by_width_and_height():
    logits = torch.tensor([[[0.0, 2.0, -1.0], [3.0, -5.0, 1.0]]])  # (1, Q=2, C=3)
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.75, 0.5, 0.5]]])
    (result,) = top_detections(logits, boxes, torch.tensor([[100, 200]]), num_select=4)  # H=100, W=200
    torch.testing.assert_close(result["scores"], torch.tensor([3.0, 2.0, 1.0, 0.0]).sigmoid())
    assert result["labels"].tolist() == [0, 1, 2, 0]
    query_0, query_1 = [80.0, 30.0, 120.0, 70.0], [0.0, 50.0, 100.0, 100.0]
    torch.testing.assert_close(result["boxes"], torch.tensor([query_1, query_0, query_1, query_0]))


def test_top_detections_clamps_keeps_ties_in_order_and_caps_at_all_pairs():
    logits = torch.zeros(2, 2, 2)  # every pair ties
    boxes = torch.tensor([[0.9, 0.1, 0.4, 0.4], [0.5, 0.5, 2.0, 2.0]]).expand(2, 2, 4)
    results = top_detections(logits, boxes, torch.tensor([[10, 20], [30, 40]]), num_select=100)
    for result, (height, width) in zip(results, [(10, 20), (30, 40)]):
        assert len(result["scores"]) == 4
        assert result["labels"].tolist() == [0, 1, 0, 1]
        first, second = result["boxes"][0].tolist(), result["boxes"][2].tolist()
        assert first == pytest.approx([0.7 * width, 0.0, width, 0.3 * height])
        assert second == [0.0, 0.0, width, height]
