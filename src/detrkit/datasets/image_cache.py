"""The image check's cache: what each file's header said, kept beside the annotations in a small JSON file.

The file is `<folder>/.detrkit-image-check.json`, one section per annotation file (or YOLO split),
mapping each image's path relative to the folder to [bytes, mtime_ns, width, height, problem].
Where the folder is not writable the cache goes to `$DETRKIT_CACHE/image-check/` (default
`~/.cache/detrkit`), named by a hash of the folder's path; where that fails too, nothing is cached.
Writes are atomic (a temporary file renamed over the old one), so processes that check at once,
as DDP ranks do, leave a whole file behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_NAME = ".detrkit-image-check.json"
CACHE_VERSION = 1


@dataclass(frozen=True)
class ImageFacts:
    """One file as checked: its byte size and mtime_ns (the cache key), the header's width and
    height, and what is wrong with it (None: nothing)."""

    size: int
    mtime_ns: int
    width: int
    height: int
    problem: str | None = None

    def matches(self, stat: os.stat_result) -> bool:
        """Whether the file is unchanged since these facts were read."""
        return self.size == stat.st_size and self.mtime_ns == stat.st_mtime_ns


def cache_files(folder: Path) -> list[Path]:
    """Where the cache of `folder` may live, in the order tried: beside the annotations, then the user's cache."""
    user = Path(os.environ.get("DETRKIT_CACHE") or Path.home() / ".cache" / "detrkit").expanduser()
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:20]
    return [folder / CACHE_NAME, user / "image-check" / f"{digest}.json"]


def load_cache(folder: Path, section: str) -> dict[str, ImageFacts]:
    """The cached facts of one section (relative path -> facts); empty when no cache can be read."""
    for path in cache_files(folder):
        sections = _read_sections(path)
        if sections is not None:
            entries = sections.get(section, {})
            try:
                return {key: ImageFacts(*value) for key, value in entries.items()}
            except TypeError:  # a cache written in another layout: check again
                return {}
    return {}


def save_cache(folder: Path, section: str, facts: dict[str, ImageFacts]) -> Path | None:
    """Replace one section of the cache; returns the file written, or None where none could be."""
    entries = {key: [value.size, value.mtime_ns, value.width, value.height, value.problem]
               for key, value in facts.items()}
    for path in cache_files(folder):
        sections = _read_sections(path) or {}
        sections[section] = entries
        try:
            _write_atomically(path, {"version": CACHE_VERSION, "sections": sections})
        except OSError as error:
            logger.debug("cannot write the image check cache %s: %s", path, error)
            continue
        return path
    return None


def _read_sections(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("sections"), dict):
        return None
    return data["sections"]


def _write_atomically(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(data, stream)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
