"""Expand what predict() is given (images, paths, directories, globs, videos, iterators) into lazy image batches.

Paths are resolved when the source is opened, so a missing file or an empty pattern fails at once;
pixels are read only when their batch is pulled, so a video or a long directory streams in bounded memory.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from detrkit.datasets.images import ImageInput

VIDEO_EXTENSIONS = frozenset({".avi", ".flv", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".ts", ".webm",
                              ".wmv"})
_GLOB_CHARACTERS = frozenset("*?[")
_VIDEO_EXTRA_HINT = 'reading videos needs PyAV: pip install "detrkit[video]"'


@dataclass(frozen=True)
class PredictSource:
    """The images of one predict() call, pulled lazily in batches of `batch_size`.

    `single` is true for one plain image (predict then returns one Detections, not a list).
    """

    images: Iterator[ImageInput]
    single: bool
    batch_size: int

    def batches(self) -> Iterator[list[ImageInput]]:
        """Consecutive lists of up to `batch_size` images; nothing is read before it is asked for."""
        while chunk := list(islice(self.images, self.batch_size)):
            yield chunk


def open_source(source: Any, batch: int | None = None, vid_stride: int = 1) -> PredictSource:
    """Resolve `source` (one image, a path, a list or tuple of them, or an iterator of them).

    `batch=None` runs a list or tuple of plain images as one batch and anything that expands
    (directory, glob, video, iterator) one image at a time.
    """
    for name, value in (("batch", batch), ("vid_stride", vid_stride)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(source, (list, tuple)):
        parts = [_expand(item, vid_stride) for item in source]
        expands = any(many for _, many in parts)
        default = 1 if expands else max(len(source), 1)
        return PredictSource(chain.from_iterable(images for images, _ in parts), False, batch or default)
    if isinstance(source, Iterator):
        images = (image for item in source for image in _expand(item, vid_stride)[0])
        return PredictSource(images, False, batch or 1)
    images, many = _expand(source, vid_stride)
    return PredictSource(iter(images), not many, batch or 1)


def _expand(item: Any, vid_stride: int) -> tuple[Iterable[ImageInput], bool]:
    """(the images `item` stands for, whether it can stand for more than one)."""
    if not isinstance(item, (str, os.PathLike)) or "://" in str(item):
        return [item], False
    path = Path(item)
    if path.is_dir():
        return directory_images(path), True
    if path.is_file():
        if path.suffix.lower() in VIDEO_EXTENSIONS:
            return video_frames(path, vid_stride), True
        return [item], False
    if _GLOB_CHARACTERS & set(str(item)):
        return _glob_images(str(item), vid_stride), True
    raise FileNotFoundError(f"no such image, video or directory: {path}")


def directory_images(directory: Path) -> list[Path]:
    """The image files directly inside `directory`, sorted by name."""
    from detrkit.datasets.yolo import IMAGE_EXTENSIONS  # imported here: yolo.py pulls in the dataset stack

    images = sorted((p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS),
                    key=lambda p: p.name)
    if not images:
        raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) in directory {directory}")
    return images


def _glob_images(pattern: str, vid_stride: int) -> Iterator[ImageInput]:
    """Every image file and video frame the pattern matches, in sorted path order."""
    from detrkit.datasets.yolo import IMAGE_EXTENSIONS

    wanted = IMAGE_EXTENSIONS | VIDEO_EXTENSIONS
    matches = sorted(p for p in glob.glob(pattern, recursive=True)
                     if os.path.isfile(p) and Path(p).suffix.lower() in wanted)
    if not matches:
        raise FileNotFoundError(f"the pattern {pattern} matches no image or video files")
    parts = [_expand(match, vid_stride)[0] for match in matches]  # opens nothing yet
    return chain.from_iterable(parts)


def video_frames(path: str | os.PathLike, vid_stride: int = 1) -> Iterator[np.ndarray]:
    """Every `vid_stride`-th frame of a video as an HWC uint8 RGB array, decoded one at a time."""
    try:
        import av
    except ImportError as error:
        raise ImportError(f"{_VIDEO_EXTRA_HINT} (to read {path})") from error
    return _decode_video(av, Path(path), vid_stride)


def _decode_video(av: Any, path: Path, vid_stride: int) -> Iterator[np.ndarray]:
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path} holds no video stream")
            for index, frame in enumerate(container.decode(video=0)):
                if index % vid_stride == 0:
                    yield frame_to_array(frame)
    except av.error.FFmpegError as error:
        raise ValueError(f"cannot decode video {path}: {error}") from error


def frame_to_array(frame: Any) -> np.ndarray:
    """A decoded PyAV frame as an HWC uint8 RGB array."""
    return frame.to_ndarray(format="rgb24")
