"""Keeps freed memory in the process heap while a CPU run trains (glibc on Linux only).

A training step allocates its activations afresh and frees them in the backward pass. By default
glibc hands blocks over 128 KiB back to the kernel when they are freed (mmap / heap trimming), so
the next step page-faults all of them in again: on the 2-core test machine about 210,000 minor
faults and 0.5-0.9 s of kernel time per Nano step at 320 px, about 9% of the step. With the
thresholds below the freed blocks stay in the heap and the next step reuses them (no faults after
the first two steps, the same peak memory). The defaults come back, and the retained memory is
returned, when fit ends. `DETRKIT_RETAIN_HEAP=0` turns this off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

import pytorch_lightning as pl

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers from glibc's malloc.h
_RETAINED_MMAP_THRESHOLD = 32 * 1024 * 1024  # the largest value glibc accepts on 64-bit
_RETAINED_TRIM_THRESHOLD = 2 * 1024 * 1024 * 1024
_GLIBC_DEFAULT_THRESHOLD = 128 * 1024  # glibc's starting value of both thresholds


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds so that freed blocks up to 32 MiB stay in the heap.
    Returns whether it did (False off glibc or with DETRKIT_RETAIN_HEAP=0)."""
    libc = _glibc()
    if libc is None or os.environ.get("DETRKIT_RETAIN_HEAP", "1") == "0":
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _RETAINED_MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, _RETAINED_TRIM_THRESHOLD))


def release_freed_memory() -> None:
    """glibc's starting thresholds again, and the free memory the heap holds back to the kernel."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_DEFAULT_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_DEFAULT_THRESHOLD)
        libc.malloc_trim(0)


class RetainHeap(pl.Callback):
    """`retain_freed_memory` for the length of a fit whose model is on the CPU."""

    def __init__(self) -> None:
        self.active = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cpu":
            self.active = retain_freed_memory()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._release()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        if self.active:
            release_freed_memory()
            self.active = False
