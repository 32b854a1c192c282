"""Files of a run get the user's usual permissions (0666 less the umask), not tempfile's 0600."""

from __future__ import annotations

import os
import stat

import pytest

from detrkit.models import download
from detrkit.training.checkpoints import replace_atomically, save_atomically


@pytest.fixture(params=[0o022, 0o027, 0o002])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_writes_follow_the_umask(tmp_path, umask):
    save_atomically({"x": 1}, tmp_path / "a.pth")
    replace_atomically(tmp_path / "b.json", lambda stream: stream.write(b"{}"))
    assert mode(tmp_path / "a.pth") == mode(tmp_path / "b.json") == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pth", "b.json"]  # no temporary left


def test_downloaded_weights_follow_the_umask(tmp_path, umask):
    fd, part = download._create_part(tmp_path, "w.pth")
    os.close(fd)
    assert mode(part) == 0o666 & ~umask and os.path.basename(part).startswith(".w.pth.")
