"""Check a data set's image files before training: each must exist, decode and have its annotated size.

How an image is checked (cheaply: about 40 microseconds a file, against 2.5 ms for a full decode):
PIL's `Image.open` reads only the header, which gives the format and the size and rejects files
that are no image. A truncated JPEG or PNG still has a readable header, and `Image.verify()` does
not notice a cut JPEG, so the last bytes are read too: a JPEG must end with its EOI marker
(FF D9), a PNG with its IEND chunk, and a WebP file must be as long as its RIFF header says. Only
a file that fails this test (a cut one, or one with data appended after its end, as motion photos
have) is decoded in full, and it is bad only when that decode fails, as it would in training.
Other formats (BMP, TIFF, ...) are checked by their header alone.

What each file's header said is cached (`image_cache.py`), keyed by the file's size and
modification time, so a second run opens no image.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from detrkit.datasets.image_cache import ImageFacts, load_cache, save_cache

logger = logging.getLogger(__name__)

MAX_LISTED = 20  # bad files named in the error; the rest are counted
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # an empty IEND chunk: length, type, CRC
JPEG_END = b"\xff\xd9"
# what PIL raises for a file it cannot read (DecompressionBombError for an image too large to trust)
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)

# (image file, its annotated (H, W) or None where the annotations give no size)
Listed = tuple[Path, "tuple[int, int] | None"]


class BadImagesError(ValueError):
    """Some image files of the data set are missing, unreadable, truncated or not their annotated size."""


def inspect_image(path: Path, stat: os.stat_result) -> ImageFacts:
    """What the file's header (and, for JPEG, PNG and WebP, its end) says; see the module docstring."""
    try:
        with Image.open(path) as image:
            width, height, kind = image.width, image.height, image.format
    except _DECODE_ERRORS as error:
        return ImageFacts(stat.st_size, stat.st_mtime_ns, 0, 0, f"cannot be opened as an image ({error})")
    problem = None
    if not _ends_complete(path, kind, stat.st_size):
        problem = _full_decode_problem(path)
    return ImageFacts(stat.st_size, stat.st_mtime_ns, width, height, problem)


def _ends_complete(path: Path, kind: str | None, size: int) -> bool:
    """Whether the file ends as a complete file of its format does (formats without a test: True)."""
    if kind not in ("JPEG", "MPO", "PNG", "WEBP"):
        return True
    with open(path, "rb") as stream:
        if kind == "WEBP":  # "RIFF" <length of the rest, little-endian> "WEBP"
            header = stream.read(8)
            return len(header) == 8 and int.from_bytes(header[4:8], "little") + 8 <= size
        end = PNG_END if kind == "PNG" else JPEG_END
        stream.seek(max(0, size - len(end)))
        return stream.read() == end


def _full_decode_problem(path: Path) -> str | None:
    try:
        with Image.open(path) as image:
            image.load()
    except _DECODE_ERRORS as error:
        return f"truncated or corrupt ({error})"
    return None


def check_images(images: Sequence[Listed], cache_folder: Path, section: str, progress: bool = False,
                 ) -> dict[Path, str]:
    """Bad file -> what is wrong with it, for the listed images. The facts of files unchanged since
    the last check (same size and mtime_ns) come from the cache of `cache_folder` (its `section`,
    one per annotation file); the others are inspected with a progress bar and the cache rewritten."""
    cached = load_cache(cache_folder, section)
    fresh: dict[str, ImageFacts] = {}
    bad: dict[Path, str] = {}
    todo: list[tuple[Path, str, os.stat_result, tuple[int, int] | None]] = []
    for path, size in images:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            bad[path] = "does not exist"
            continue
        key = os.path.relpath(path, cache_folder)
        facts = cached.get(key)
        if facts is not None and facts.matches(stat):
            fresh[key] = facts
            _judge(path, facts, size, bad)
        else:
            todo.append((path, key, stat, size))
    bar = tqdm(todo, desc=f"checking images ({section})", unit="image", disable=not progress or not todo,
               leave=False)
    for path, key, stat, size in bar:
        fresh[key] = inspect_image(path, stat)
        _judge(path, fresh[key], size, bad)
    if fresh != cached:
        save_cache(cache_folder, section, fresh)
    return bad


def _judge(path: Path, facts: ImageFacts, size: tuple[int, int] | None, bad: dict[Path, str]) -> None:
    if facts.problem is not None:
        bad[path] = facts.problem
    elif size is not None and (facts.height, facts.width) != tuple(size):
        bad[path] = (f"is {facts.width}x{facts.height} (WxH) but its annotations say {size[1]}x{size[0]}")


@dataclass
class ImageScreen:
    """The up-front check of every split a run reads. Readers call it with each split's images and
    leave out the bad ones it returns; `finish()` then raises one BadImagesError naming them all, or
    with `skip` warns once with the count."""

    skip: bool = False
    progress: bool = False
    bad: dict[Path, str] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # section -> (bad, listed)

    def __call__(self, cache_folder: Path, section: str, images: Sequence[Listed]) -> set[Path]:
        found = check_images(images, cache_folder, section, self.progress)
        self.bad.update(found)
        label = f"{cache_folder.name}/{section}"
        self.counts[label] = (len(found), len(images))
        return set(found)

    def finish(self) -> None:
        if not self.bad:
            return
        emptied = [label for label, (bad, listed) in self.counts.items() if listed and bad == listed]
        if not self.skip or emptied:
            reason = f"every image of {', '.join(emptied)} is bad" if self.skip else \
                "fix or remove them, or pass skip_bad_images=True to train without them"
            raise BadImagesError(f"{len(self.bad)} bad image file(s) ({reason}):\n{self.listing()}")
        per_split = ", ".join(f"{label} {bad}" for label, (bad, _) in self.counts.items() if bad)
        warnings.warn(f"skip_bad_images=True: leaving out {len(self.bad)} bad image file(s) ({per_split}):\n"
                      f"{self.listing(3)}", stacklevel=3)

    def listing(self, limit: int = MAX_LISTED) -> str:
        """One line per bad file, up to `limit`, then how many more."""
        lines = [f"  {path}: {problem}" for path, problem in list(self.bad.items())[:limit]]
        if len(self.bad) > limit:
            lines.append(f"  and {len(self.bad) - limit} more")
        return "\n".join(lines)
