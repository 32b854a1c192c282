"""A shared-memory table of the sample each data loader worker is loading, read after a worker died.

A worker killed by a signal (the kernel's out-of-memory killer, a crashing image decoder) cannot
say what it was doing; PyTorch then reports only its pid. The table is made before the workers
start and lives in shared memory (forked workers inherit it, spawned ones receive it through
torch's pickling), so the main process can still read the dead worker's row.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.data import get_worker_info

IDLE = -1  # the index of a worker that is loading no sample


class LoadingSlots:
    """One row per loader worker, (index it is loading or IDLE, its pid). No rows: nothing is recorded."""

    def __init__(self, workers: int = 0) -> None:
        self.table = torch.full((workers, 2), IDLE, dtype=torch.int64)  # (workers, [index, pid])
        if workers:
            self.table.share_memory_()

    def __len__(self) -> int:
        return len(self.table)

    @contextmanager
    def loading(self, index: int) -> Iterator[None]:
        """Marks `index` as loading in this worker's row for the duration (in the main process: nothing)."""
        worker = get_worker_info()
        if worker is None or worker.id >= len(self.table):  # the main process names its own errors
            yield
            return
        row = self.table[worker.id]
        row[1] = os.getpid()
        row[0] = index
        try:
            yield
        finally:
            row[0] = IDLE

    def loading_in(self, pid: int) -> int | None:
        """The index the worker process `pid` was loading; None when it held none (or is not one of these)."""
        for index, worker_pid in self.table.tolist():
            if worker_pid == pid and index != IDLE:
                return index
        return None
