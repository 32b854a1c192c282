"""Find a published checkpoint in the local cache, or download it with a progress bar and check its md5."""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

DEFAULT_WEIGHTS_URL = "https://storage.googleapis.com"
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 30.0

# published file name -> (path under the weights URL, md5 of the file)
PUBLISHED_WEIGHTS: dict[str, tuple[str, str]] = {
    "rf-detr-nano.pth": ("/rfdetr/nano_coco/checkpoint_best_regular.pth", "fb6504cce7fbdc783f7a46991f07639f"),
    "rf-detr-small.pth": ("/rfdetr/small_coco/checkpoint_best_regular.pth", "fb37061c1af7bace359c91b723a8d5c1"),
    "rf-detr-medium.pth": ("/rfdetr/medium_coco/checkpoint_best_regular.pth", "7223f764a87b863f02eb8d52bf0ce2ee"),
    "rf-detr-large-2026.pth": ("/rfdetr/rf-detr-large-2026.pth", "5cb72153541cbcb9aa6efa26222acc75"),
    "rf-detr-large.pth": ("/rfdetr/rf-detr-large.pth", "992c8e862aa733a7bb2777e45d49f1a0"),
    "rf-detr-base.pth": ("/rfdetr/rf-detr-base-coco.pth", "b4d3ce46099eaed50626ede388caf979"),
    "rf-detr-base-o365.pth": ("/rfdetr/top-secret-1234/lwdetr_dinov2_small_o365_checkpoint.pth", "d93f4921ccbb0f0a2e4364bed290892b"),
    "rf-detr-base-2.pth": ("/rfdetr/rf-detr-base-2.pth", "462f4d9df407ddc1812f42614040e913"),
    "rf-detr-keypoint-preview-xlarge.pth": ("/rfdetr/rf-detr-keypoint-preview-xlarge.pth", "6de511943ee85a547d4c5cb527daf0eb"),
    "rf-detr-seg-preview.pt": ("/rfdetr/rf-detr-seg-preview.pt", "e35820c28fb86080558123e47a5e49ca"),
    "rf-detr-seg-nano.pt": ("/rfdetr/rf-detr-seg-n-ft.pth", "9995497791d0ff1664a1d9ddee9cfd20"),
    "rf-detr-seg-small.pt": ("/rfdetr/rf-detr-seg-s-ft.pth", "0a2a3006381d0c42853907e700eadd08"),
    "rf-detr-seg-medium.pt": ("/rfdetr/rf-detr-seg-m-ft.pth", "a49af1562c3719227ad43d0ca53b4c7a"),
    "rf-detr-seg-large.pt": ("/rfdetr/rf-detr-seg-l-ft.pth", "275f7b094909544ed2841c94a677d07e"),
    "rf-detr-seg-xlarge.pt": ("/rfdetr/rf-detr-seg-xl-ft.pth", "3693b35d0eea86ebb3e0444f4a611fba"),
    "rf-detr-seg-xxlarge.pt": ("/rfdetr/rf-detr-seg-2xl-ft.pth", "040bc3412af840fa8a47e0ff69b552ba"),
}

# The ways forward when a published checkpoint cannot be had, in the words of the Python API and of the CLI.
_HOW_TO_GO_ON = {
    "python": "To go on, pass pretrain_weights=None to train from scratch, or a local file path, "
              "or place the file at {target}, or set DETRKIT_WEIGHTS_URL to a mirror.",
    "cli": "To go on, pass --weights none to train from scratch, or --weights PATH for a local file, "
           "or place the file at {target}, or set DETRKIT_WEIGHTS_URL to a mirror.",
}
# Failures of the connection or the transfer; disk errors are left to surface as they are.
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)


class WeightsDownloadError(OSError):
    """A published checkpoint could not be downloaded, or its bytes failed the md5 check.

    `problem` says what went wrong; str() adds how to go on from Python, `how_to_go_on("cli")`
    says it in the command line's words."""

    def __init__(self, problem: str, target: Path) -> None:
        self.problem, self.target = problem, target
        super().__init__(f"{problem}. {self.how_to_go_on('python')}")

    def how_to_go_on(self, caller: str) -> str:
        return _HOW_TO_GO_ON[caller].format(target=self.target)


def cache_dir() -> Path:
    """Folder for downloaded checkpoints: $DETRKIT_CACHE, else ~/.cache/detrkit."""
    return Path(os.environ.get("DETRKIT_CACHE") or Path.home() / ".cache" / "detrkit").expanduser()


def weights_url(name: str) -> str:
    """Download address of a published checkpoint; $DETRKIT_WEIGHTS_URL replaces the base."""
    base = os.environ.get("DETRKIT_WEIGHTS_URL") or DEFAULT_WEIGHTS_URL
    return base.rstrip("/") + PUBLISHED_WEIGHTS[name][0]


def resolve_weights(name_or_path: str | os.PathLike[str]) -> Path:
    """Path of a checkpoint: a local file as given, a cached published one, or a fresh download."""
    value = os.fspath(name_or_path)
    if Path(value).name != value or Path(value).is_file():
        return _local_file(Path(value).expanduser())
    cached = cache_dir() / value
    if cached.is_file():
        if value in PUBLISHED_WEIGHTS:
            _warn_if_changed(cached, PUBLISHED_WEIGHTS[value][1])
        return cached
    if value in PUBLISHED_WEIGHTS:
        return download_weights(value)
    raise FileNotFoundError(
        f"no checkpoint {value!r}: it is not a file in the working directory nor in the cache "
        f"{cache_dir()}, and not a published name. Published names: {', '.join(PUBLISHED_WEIGHTS)}"
    )


def download_weights(name: str) -> Path:
    """Download a published checkpoint into the cache, check its md5, and return its path."""
    url, expected = weights_url(name), PUBLISHED_WEIGHTS[name][1]
    target = cache_dir() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, part = _create_part(target.parent, name)
    try:
        with os.fdopen(fd, "wb") as out:
            actual = _stream(url, out, name)
        if actual != expected:
            raise WeightsDownloadError(f"download of {url} is corrupt: md5 {actual}, expected {expected}", target)
        os.replace(part, target)  # atomic: the final name never holds a partial file
    except _NETWORK_ERRORS as err:
        if isinstance(err, urllib.error.HTTPError):
            err.close()  # an HTTPError holds the server's open response
        # the cause is in the message: one traceback, not two chained
        raise WeightsDownloadError(
            f"could not download {url} ({err}); looked for it in the cache at {target}", target) from None
    finally:
        Path(part).unlink(missing_ok=True)  # a no-op once the file is in place
    return target


def _create_part(folder: Path, name: str) -> tuple[int, str]:
    """A new `.part` file beside the cache entry, with the user's umask (tempfile.mkstemp makes 0600)."""
    for _ in range(100):
        part = folder / f".{name}.{secrets.token_hex(6)}.part"
        try:
            return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(part)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name} in {folder}")


def _stream(url: str, out: BinaryIO, label: str) -> str:
    """Copy the body at url into out chunk by chunk and return its md5 hex digest."""
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, disable=None) as bar:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        # HTTPResponse.read(n) returns b"" on an early close instead of raising.
        raise ConnectionError(f"connection closed after {received} of {total} bytes")
    return digest.hexdigest()


def _local_file(path: Path) -> Path:
    """Resolved path of a checkpoint file given by the user, which must exist."""
    if path.is_file():
        return path.resolve()
    hint = ""
    if path.name in PUBLISHED_WEIGHTS:
        hint = f" (pass the bare name {path.name!r} to download the published checkpoint)"
    raise FileNotFoundError(f"no checkpoint file at {path}{hint}")


def _warn_if_changed(cached: Path, expected: str) -> None:
    """Warn when a cached published checkpoint differs from the published bytes."""
    digest = hashlib.md5(usedforsecurity=False)
    with cached.open("rb") as src:
        while chunk := src.read(CHUNK_BYTES):
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual != expected:
        warnings.warn(
            f"cached checkpoint {cached} has md5 {actual}, the published one has "
            f"{expected}; using the cached file anyway (delete it to download again)",
            stacklevel=3,
        )
