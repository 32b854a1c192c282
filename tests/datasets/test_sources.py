"""Tests that predict() sources expand to the right images, lazily, and fail naming the path."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detrkit.datasets import sources
from detrkit.datasets.sources import directory_images, open_source, video_frames


def frame(seed: int, height: int = 48, width: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_video(path: Path, frames: list[np.ndarray], rate: int = 5) -> Path:
    """A lossless (FFV1) video, so decoded frames equal the written arrays exactly."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "bgr0"
        for array in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())
    return path


def collect(source) -> list:
    return [image for chunk in source.batches() for image in chunk]


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for index, name in enumerate(["b.png", "a.jpg", "C.JPEG", "c.webp"]):
        Image.fromarray(frame(index)).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    (folder / "nested").mkdir()
    Image.fromarray(frame(9)).save(folder / "nested" / "deep.png")
    return folder


# -- paths, directories, globs ---------------------------------------------------------------


def test_a_directory_gives_its_images_sorted_by_name(image_dir):
    assert [p.name for p in directory_images(image_dir)] == ["C.JPEG", "a.jpg", "b.png", "c.webp"]
    source = open_source(image_dir)
    assert not source.single and source.batch_size == 1
    assert [Path(p).name for p in collect(source)] == ["C.JPEG", "a.jpg", "b.png", "c.webp"]


def test_an_empty_directory_names_itself(tmp_path):
    (tmp_path / "readme.md").write_text("no images here")
    with pytest.raises(FileNotFoundError, match=f"no images .* in directory {tmp_path}"):
        open_source(tmp_path)


def test_a_glob_gives_matching_images_in_sorted_order(image_dir):
    source = open_source(str(image_dir / "*.*g"))
    assert [Path(p).name for p in collect(source)] == ["a.jpg", "b.png"]
    everything = open_source(str(image_dir / "**" / "*"))  # recursive; the .txt is skipped
    assert sorted(Path(p).name for p in collect(everything)) == ["C.JPEG", "a.jpg", "b.png", "c.webp", "deep.png"]


def test_a_glob_matching_nothing_names_the_pattern(image_dir):
    pattern = str(image_dir / "*.bmp")
    with pytest.raises(FileNotFoundError, match=r"pattern .*\*\.bmp matches no image"):
        open_source(pattern)
    with pytest.raises(FileNotFoundError, match="matches no image"):
        open_source(str(image_dir / "*.txt"))  # matches a file, but not an image


def test_a_missing_path_names_itself_even_inside_a_list(tmp_path):
    path = tmp_path / "gone.jpg"
    with pytest.raises(FileNotFoundError, match=f"no such image, video or directory: {path}"):
        open_source(path)
    with pytest.raises(FileNotFoundError, match=str(path)):
        open_source([frame(0), str(path)])  # raised when opened, before any image is read


def test_a_single_image_path_stays_single_and_unread(tmp_path):
    path = tmp_path / "one.png"
    Image.fromarray(frame(0)).save(path)
    source = open_source(str(path))
    assert source.single
    assert collect(source) == [str(path)]  # a path, read later by to_tensor


# -- lists, iterators, batching --------------------------------------------------------------


def test_a_list_of_plain_images_is_one_batch_by_default():
    images = [frame(i) for i in range(5)]
    assert [len(chunk) for chunk in open_source(images).batches()] == [5]
    assert [len(chunk) for chunk in open_source(images, batch=2).batches()] == [2, 2, 1]
    assert list(open_source([]).batches()) == []


def test_a_list_that_expands_runs_one_at_a_time_by_default(image_dir):
    array = frame(7)
    source = open_source([array, image_dir])
    assert source.batch_size == 1 and not source.single
    images = collect(source)
    assert images[0] is array
    assert [Path(p).name for p in images[1:]] == ["C.JPEG", "a.jpg", "b.png", "c.webp"]


def test_an_iterator_is_pulled_only_as_batches_are():
    pulled = []

    def frames():
        for index in range(4):
            pulled.append(index)
            yield frame(index)

    source = open_source(frames(), batch=2)
    assert pulled == [] and not source.single
    batches = source.batches()
    assert len(next(batches)) == 2 and pulled == [0, 1]
    assert len(next(batches)) == 2 and pulled == [0, 1, 2, 3]


@pytest.mark.parametrize("keyword", ["batch", "vid_stride"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_batch_and_vid_stride_must_be_positive_integers(keyword, value):
    with pytest.raises(ValueError, match=f"{keyword} must be a positive integer"):
        open_source(frame(0), **{keyword: value})


def test_non_path_objects_pass_through_untouched():
    weird = {"image": 1}  # a mapping is not an iterator of images; to_tensor refuses it later
    source = open_source(weird)
    assert source.single and collect(source) == [weird]


# -- video -----------------------------------------------------------------------------------


def test_video_frames_decode_exactly_and_respect_the_stride(tmp_path):
    frames = [frame(i) for i in range(6)]
    path = write_video(tmp_path / "clip.mkv", frames)
    decoded = list(video_frames(path))
    assert len(decoded) == 6
    for got, want in zip(decoded, frames):
        assert got.dtype == np.uint8 and got.shape == (48, 64, 3)
        np.testing.assert_array_equal(got, want)
    strided = list(video_frames(path, vid_stride=4))
    assert len(strided) == 2
    np.testing.assert_array_equal(strided[1], frames[4])


def test_a_video_path_expands_to_frames_decoded_one_by_one(tmp_path, monkeypatch):
    frames = [frame(i) for i in range(6)]
    path = write_video(tmp_path / "clip.mkv", frames)
    converted = []
    original = sources.frame_to_array
    monkeypatch.setattr(sources, "frame_to_array", lambda f: converted.append(original(f)) or converted[-1])
    source = open_source(path, vid_stride=2)
    assert not source.single and converted == []
    batches = source.batches()
    assert len(next(batches)) == 1 and len(converted) == 1
    assert len(list(batches)) == 2 and len(converted) == 3
    for got, want in zip(converted, frames[::2]):
        np.testing.assert_array_equal(got, want)


def test_a_glob_can_match_videos(tmp_path):
    write_video(tmp_path / "a.mkv", [frame(i) for i in range(3)])
    Image.fromarray(frame(5)).save(tmp_path / "b.png")
    images = collect(open_source(str(tmp_path / "*")))
    assert len(images) == 4
    np.testing.assert_array_equal(images[2], frame(2))
    assert Path(images[3]).name == "b.png"


def test_a_broken_video_names_the_file(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(b"this is not a video")
    source = open_source(path)  # opening is lazy; decoding reports the file
    with pytest.raises(ValueError, match=f"cannot decode video {path}"):
        collect(source)


def test_without_pyav_videos_ask_for_the_video_extra(tmp_path, monkeypatch):
    path = write_video(tmp_path / "clip.mkv", [frame(0)])
    monkeypatch.setitem(sys.modules, "av", None)  # makes `import av` raise ImportError
    with pytest.raises(ImportError, match=r'pip install "detrkit\[video\]"'):
        open_source(path)
