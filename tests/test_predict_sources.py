"""Tests that predict() reads directories, globs, videos and iterators, in batches or as a stream (spec 10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import supervision as sv
import torch
from PIL import Image
from test_predict import assert_same, photo, tiny

from detrkit import RFDETRNano
from detrkit.datasets import sources


def write_video(path: Path, frames: list[np.ndarray], codec: str = "ffv1") -> Path:
    """FFV1 is lossless (decoded frames equal the arrays); mpeg4 is the lossy everyday kind."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=5)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        for array in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())
    return path


def count_forwards(model: RFDETRNano) -> list[int]:
    calls: list[int] = []
    model.model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    return calls


def test_a_directory_gives_one_result_per_image_in_name_order(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    images = {"b.png": photo(50, 80, 0), "a.png": photo(70, 60, 1), "c.jpg": photo(64, 64, 2)}
    for name, image in images.items():
        Image.fromarray(image).save(tmp_path / name)
    (tmp_path / "labels.txt").write_text("skipped")
    calls = count_forwards(model)
    results = model.predict(tmp_path, threshold=0.0)
    assert calls == [1, 1, 1]  # one image at a time by default
    assert isinstance(results, list) and len(results) == 3
    for got, name in zip(results, ["a.png", "b.png", "c.jpg"]):
        assert_same(got, model.predict(tmp_path / name, threshold=0.0), atol=0)
    glob_results = model.predict(str(tmp_path / "*.png"), threshold=0.0)
    assert [r.data["source_shape"][0].tolist() for r in glob_results] == [[70, 60], [50, 80]]


def test_a_list_may_mix_paths_directories_arrays_pil_and_tensors(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    images = [photo(40 + 8 * i, 64, i) for i in range(5)]
    (tmp_path / "dir").mkdir()
    Image.fromarray(images[0]).save(tmp_path / "dir" / "x.png")
    Image.fromarray(images[1]).save(tmp_path / "one.png")
    mixed = [tmp_path / "dir", str(tmp_path / "one.png"), images[2], Image.fromarray(images[3]),
             torch.from_numpy(images[4]).permute(2, 0, 1)]
    results = model.predict(mixed, threshold=0.0)
    assert len(results) == 5
    for got, image in zip(results, images):
        assert_same(got, model.predict(image, threshold=0.0), atol=1e-5)


def test_batches_agree_with_one_image_at_a_time(tiny_kwargs):
    model = tiny(tiny_kwargs)
    images = [photo(40 + 10 * i, 90 - 7 * i, i) for i in range(5)]
    singles = [model.predict(image, threshold=0.0) for image in images]
    calls = count_forwards(model)
    batched = model.predict(images, threshold=0.0, batch=2)
    assert calls == [2, 2, 1]
    for got, want in zip(batched, singles):
        assert_same(got, want, atol=1e-4)


def test_a_video_gives_one_result_per_frame_and_vid_stride_skips(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    frames = [photo(64, 64, seed) for seed in range(6)]
    path = write_video(tmp_path / "clip.mkv", frames)
    wanted = model.predict(frames, threshold=0.0)  # one batch
    results = model.predict(path, threshold=0.0)
    assert isinstance(results, list) and len(results) == 6
    for got, want in zip(results, wanted):
        assert_same(got, want, atol=1e-4)
    strided = model.predict(str(path), threshold=0.0, vid_stride=2, batch=3)
    assert len(strided) == 3
    for got, want, image in zip(strided, wanted[::2], frames[::2]):
        assert_same(got, want, atol=1e-4)
        np.testing.assert_array_equal(got.metadata["source_image"], image)


def test_a_lossy_mp4_is_read_like_its_decoded_frames(tiny_kwargs, tmp_path):
    from detrkit.datasets.sources import video_frames

    model = tiny(tiny_kwargs)
    path = write_video(tmp_path / "clip.mp4", [photo(64, 64, seed) for seed in range(6)], codec="mpeg4")
    decoded = list(video_frames(path))
    results = model.predict(path, threshold=0.0, batch=6)
    assert len(results) == len(decoded) == 6
    for got, want in zip(results, model.predict(decoded, threshold=0.0)):
        assert_same(got, want, atol=0)


def test_stream_decodes_a_frame_only_when_its_result_is_asked_for(tiny_kwargs, tmp_path, monkeypatch):
    model = tiny(tiny_kwargs)
    path = write_video(tmp_path / "clip.mkv", [photo(64, 64, seed) for seed in range(6)])
    decoded = []
    original = sources.frame_to_array
    monkeypatch.setattr(sources, "frame_to_array", lambda frame: decoded.append(1) or original(frame))
    results = model.predict(path, threshold=0.0, stream=True)
    assert isinstance(results, Iterator) and decoded == []
    first = next(results)
    assert isinstance(first, sv.Detections) and len(decoded) == 1
    assert len(list(results)) == 5 and len(decoded) == 6


def test_stream_pulls_an_iterator_one_batch_at_a_time(tiny_kwargs):
    model = tiny(tiny_kwargs)
    pulled = []

    def frames():
        for seed in range(5):
            pulled.append(seed)
            yield photo(48, 64, seed)

    results = model.predict(frames(), threshold=0.0, stream=True, batch=2)
    assert pulled == []
    first = next(results)
    assert pulled == [0, 1]
    assert_same(first, model.predict(photo(48, 64, 0), threshold=0.0), atol=1e-4)
    next(results)
    assert pulled == [0, 1]  # the second result of the batch needs no new image
    next(results)
    assert pulled == [0, 1, 2, 3]
    assert len(model.predict(frames(), threshold=0.0)) == 5  # without stream: a list


def test_stream_of_one_image_yields_it_and_an_empty_list_gives_nothing(tiny_kwargs):
    model = tiny(tiny_kwargs)
    results = model.predict(photo(40, 40), threshold=0.0, stream=True)
    assert isinstance(results, Iterator)
    (only,) = list(results)
    assert_same(only, model.predict(photo(40, 40), threshold=0.0), atol=0)
    assert model.predict([], threshold=0.0) == []


def test_source_image_is_the_hwc_uint8_rgb_input(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    image = photo(50, 80)
    Image.fromarray(image).save(tmp_path / "image.png")
    gray = Image.fromarray(image[:, :, 0], mode="L")
    inputs = [tmp_path / "image.png", image, Image.fromarray(image),
              torch.from_numpy(image).permute(2, 0, 1), torch.from_numpy(image).permute(2, 0, 1).float() / 255]
    for got in model.predict(inputs, threshold=0.0):
        source = got.metadata["source_image"]
        assert source.dtype == np.uint8 and source.shape == (50, 80, 3) and source.flags.c_contiguous
        np.testing.assert_array_equal(source, image)
    assert not np.shares_memory(model.predict(image).metadata["source_image"], image)
    np.testing.assert_array_equal(model.predict(gray).metadata["source_image"], np.repeat(image[:, :, :1], 3, 2))
    assert "source_image" not in model.predict(image, include_source_image=False).metadata


def test_missing_files_and_empty_patterns_name_the_path(tiny_kwargs, tmp_path):
    model = tiny(tiny_kwargs)
    with pytest.raises(FileNotFoundError, match=r"pattern .*\*\.jpg matches no image"):
        model.predict(str(tmp_path / "*.jpg"))
    with pytest.raises(FileNotFoundError, match=f"in directory {tmp_path}"):
        model.predict(tmp_path, stream=True)  # raised at the call, not on the first next()
    with pytest.raises(FileNotFoundError, match="gone.mp4"):
        model.predict([photo(32, 32), tmp_path / "gone.mp4"], stream=True)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        model.predict(photo(32, 32), batch=0)
