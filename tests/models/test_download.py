"""Tests that checkpoints are found locally or in the cache, or downloaded from a real local HTTP server."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from pathlib import Path

import pytest

from detrkit.models import download
from detrkit.models.download import WeightsDownloadError, cache_dir, resolve_weights

NAME = "rf-detr-nano.pth"
BODY = bytes(range(256)) * 64  # 16 KiB, more than one read on a slow socket
BODY_MD5 = hashlib.md5(BODY).hexdigest()


class CheckpointHandler(http.server.BaseHTTPRequestHandler):
    """Serves server.body for any path, as server.mode says: "ok", "missing" or "truncated"."""

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.server.mode == "missing":
            self.send_error(404)
            return
        promised = len(self.server.body) + (1000 if self.server.mode == "truncated" else 0)
        self.send_response(200)
        self.send_header("Content-Length", str(promised))
        self.end_headers()
        self.wfile.write(self.server.body)  # HTTP/1.0: the connection closes after this

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder, with the published md5 of NAME set to that of BODY."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("DETRKIT_CACHE", str(folder))
    for proxy_bypass in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(proxy_bypass, "*")
    url_path, _ = download.PUBLISHED_WEIGHTS[NAME]
    monkeypatch.setitem(download.PUBLISHED_WEIGHTS, NAME, (url_path, BODY_MD5))
    return folder


@pytest.fixture
def server(cache: Path, monkeypatch: pytest.MonkeyPatch):
    """A local HTTP server that DETRKIT_WEIGHTS_URL points at, below a /mirror prefix."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CheckpointHandler)
    httpd.body, httpd.mode, httpd.paths = BODY, "ok", []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    monkeypatch.setenv("DETRKIT_WEIGHTS_URL", f"http://127.0.0.1:{httpd.server_port}/mirror/")
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_download_writes_exact_bytes_and_second_call_uses_cache(server, cache: Path) -> None:
    first = resolve_weights(NAME)
    assert first == cache / NAME
    assert first.read_bytes() == BODY
    assert server.paths == ["/mirror/rfdetr/nano_coco/checkpoint_best_regular.pth"]
    assert resolve_weights(NAME) == first
    assert len(server.paths) == 1
    assert [p.name for p in cache.iterdir()] == [NAME]


def test_md5_mismatch_raises_and_leaves_nothing(server, cache: Path) -> None:
    server.body = b"not the published bytes"
    with pytest.raises(WeightsDownloadError) as caught:
        resolve_weights(NAME)
    message = str(caught.value)
    assert BODY_MD5 in message and hashlib.md5(server.body).hexdigest() in message
    assert server.paths[0] in message
    assert list(cache.iterdir()) == []


def test_http_404_names_url_and_how_to_go_on(server, cache: Path) -> None:
    server.mode = "missing"
    with pytest.raises(WeightsDownloadError) as caught:
        resolve_weights(NAME)
    message = str(caught.value)
    assert download.weights_url(NAME) in message
    assert "pretrain_weights=None" in message and str(cache / NAME) in message
    assert list(cache.iterdir()) == []


def test_truncated_body_raises_and_leaves_nothing(server, cache: Path) -> None:
    server.mode = "truncated"
    with pytest.raises(WeightsDownloadError, match=f"after {len(BODY)} of {len(BODY) + 1000} bytes"):
        resolve_weights(NAME)
    assert list(cache.iterdir()) == []


def test_unreachable_server_raises_with_guidance(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETRKIT_WEIGHTS_URL", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(WeightsDownloadError) as caught:
        resolve_weights(NAME)
    message = str(caught.value)
    assert download.weights_url(NAME) in message
    assert "pretrain_weights=None" in message and "DETRKIT_WEIGHTS_URL" in message
    assert not (cache / NAME).exists()


def test_cached_file_with_wrong_md5_is_kept_with_warning(server, cache: Path) -> None:
    cache.mkdir()
    (cache / NAME).write_bytes(b"locally changed")
    with pytest.warns(UserWarning, match=NAME) as caught:
        found = resolve_weights(NAME)
    message = next(str(w.message) for w in caught if NAME in str(w.message))
    assert BODY_MD5 in message and hashlib.md5(b"locally changed").hexdigest() in message
    assert found == cache / NAME and found.read_bytes() == b"locally changed"
    assert server.paths == []


def test_cached_unpublished_name_is_returned(cache: Path) -> None:
    cache.mkdir()
    (cache / "my-finetune.pth").write_bytes(b"weights")
    assert resolve_weights("my-finetune.pth") == cache / "my-finetune.pth"


def test_existing_local_path_is_returned_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "own.pth"
    own.write_bytes(b"weights")
    assert resolve_weights(str(own)) == own
    monkeypatch.chdir(tmp_path)
    assert resolve_weights("./own.pth") == own.resolve()
    assert resolve_weights("own.pth") == own.resolve()


def test_missing_local_path_raises_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere" / NAME
    with pytest.raises(FileNotFoundError, match="no checkpoint file at") as caught:
        resolve_weights(str(missing))
    assert str(missing) in str(caught.value) and f"bare name '{NAME}'" in str(caught.value)


def test_unknown_bare_name_lists_published_names(cache: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        resolve_weights("no-such-model.pth")
    message = str(caught.value)
    assert str(cache) in message
    assert all(name in message for name in download.PUBLISHED_WEIGHTS)


def test_cache_dir_defaults_to_home_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DETRKIT_CACHE", raising=False)
    assert cache_dir() == tmp_path / ".cache" / "detrkit"
    monkeypatch.setenv("DETRKIT_CACHE", "")
    assert cache_dir() == tmp_path / ".cache" / "detrkit"
    monkeypatch.setenv("DETRKIT_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"


def test_weights_url_uses_published_base_unless_mirrored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETRKIT_WEIGHTS_URL", "")
    assert download.weights_url("rf-detr-seg-nano.pt") == "https://storage.googleapis.com/rfdetr/rf-detr-seg-n-ft.pth"
    monkeypatch.setenv("DETRKIT_WEIGHTS_URL", "http://mirror.local/base/")
    assert download.weights_url("rf-detr-base.pth") == "http://mirror.local/base/rfdetr/rf-detr-base-coco.pth"


def test_segmentation_checkpoint_downloads_under_its_published_name(server, cache: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = "rf-detr-seg-nano.pt"
    url_path, _ = download.PUBLISHED_WEIGHTS[name]
    monkeypatch.setitem(download.PUBLISHED_WEIGHTS, name, (url_path, BODY_MD5))
    found = resolve_weights(name)
    assert found == cache / name and found.read_bytes() == BODY
    assert server.paths == ["/mirror/rfdetr/rf-detr-seg-n-ft.pth"]  # the file is named otherwise upstream
    assert resolve_weights(name) == found and len(server.paths) == 1


def test_every_segmentation_preset_names_a_published_checkpoint() -> None:
    from detrkit.variants import VARIANTS

    published = {  # spec 1.2: cache name -> (upstream path, md5)
        "rf-detr-seg-nano.pt": ("/rfdetr/rf-detr-seg-n-ft.pth", "9995497791d0ff1664a1d9ddee9cfd20"),
        "rf-detr-seg-small.pt": ("/rfdetr/rf-detr-seg-s-ft.pth", "0a2a3006381d0c42853907e700eadd08"),
        "rf-detr-seg-medium.pt": ("/rfdetr/rf-detr-seg-m-ft.pth", "a49af1562c3719227ad43d0ca53b4c7a"),
        "rf-detr-seg-large.pt": ("/rfdetr/rf-detr-seg-l-ft.pth", "275f7b094909544ed2841c94a677d07e"),
        "rf-detr-seg-xlarge.pt": ("/rfdetr/rf-detr-seg-xl-ft.pth", "3693b35d0eea86ebb3e0444f4a611fba"),
        "rf-detr-seg-xxlarge.pt": ("/rfdetr/rf-detr-seg-2xl-ft.pth", "040bc3412af840fa8a47e0ff69b552ba"),
    }
    presets = [cls.config_class.model_fields["pretrain_weights"].default
               for name, cls in VARIANTS.items() if name.startswith("seg-")]
    assert sorted(presets) == sorted(published)
    assert {name: download.PUBLISHED_WEIGHTS[name] for name in published} == published


def test_keypoint_checkpoint_downloads_under_its_published_name(server, cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from detrkit.variants import RFDETRKeypointPreviewConfig

    name = RFDETRKeypointPreviewConfig.model_fields["pretrain_weights"].default
    assert name == "rf-detr-keypoint-preview-xlarge.pth"
    assert download.PUBLISHED_WEIGHTS[name] == ("/rfdetr/rf-detr-keypoint-preview-xlarge.pth",
                                                "6de511943ee85a547d4c5cb527daf0eb")  # spec 1.2
    monkeypatch.setitem(download.PUBLISHED_WEIGHTS, name, (download.PUBLISHED_WEIGHTS[name][0], BODY_MD5))
    found = resolve_weights(name)
    assert found == cache / name and found.read_bytes() == BODY
    assert server.paths == ["/mirror/rfdetr/rf-detr-keypoint-preview-xlarge.pth"]
    assert resolve_weights(name) == found and len(server.paths) == 1
