"""Turn PyTorch's "DataLoader worker (pid N) is killed by signal" into an error naming the sample it was loading."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from detrkit.datasets.detection import DetectionDataset, SampleLoadError

# PyTorch's wording: "DataLoader worker (pid 123) is killed by signal: Killed." (from its SIGCHLD
# handler) or "DataLoader worker (pid(s) 123, 456) exited unexpectedly" (from its liveness check)
_WORKER_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? (\d+(?:, \d+)*)\)")
_SIGNAL = re.compile(r"killed by signal: ([^.]+)")
_SIGNAL_NAMES = {signal.strsignal(number): number.name for number in signal.Signals if signal.strsignal(number)}


class SampleWorkerKilled(SampleLoadError):
    """A data loader worker died (killed by a signal) while it was loading a sample; the message
    names the sample's index, image id and file, and the signal."""


@contextmanager
def naming_worker_deaths(datasets: Sequence[DetectionDataset]) -> Iterator[None]:
    """Inside, a loader worker of one of `datasets` that dies while loading a sample raises
    SampleWorkerKilled naming it (and the PyTorch error it replaces) instead of that bare error."""
    try:
        yield
    except RuntimeError as error:
        named = worker_death(error, datasets)
        if named is None:
            raise
        raise named from error


def worker_death(error: RuntimeError, datasets: Sequence[DetectionDataset]) -> SampleWorkerKilled | None:
    """The SampleWorkerKilled for PyTorch's report of a dead worker; None for any other error, or
    when the dead workers were loading no sample of `datasets` (between samples, say)."""
    text = str(error)
    found = _WORKER_DEATH.search(text)
    if found is None:
        return None
    pids = [int(pid) for pid in found.group(1).split(", ")]
    loading = [(pid, dataset.sample_name(index)) for pid in pids for dataset in datasets
               if (index := dataset.slots.loading_in(pid)) is not None]
    if not loading:
        return None
    killed, codes = _SIGNAL.search(text), _exit_codes(error.__traceback__)
    named = "; ".join(f"data loader worker (pid {pid}) {_how(killed, codes.get(pid))} while loading {sample}"
                      for pid, sample in loading)
    return SampleWorkerKilled(
        f"{named}. A signal comes from outside Python: the kernel's out-of-memory killer (SIGKILL: lower "
        f"num_workers or batch_size), a crash in an image decoder (SIGSEGV, SIGBUS: check that file), or another "
        f"process; with num_workers=0 samples load in the main process. PyTorch said: {text.strip()}")


def _how(killed: re.Match | None, exit_code: int | None) -> str:
    """'was killed by signal: Killed (SIGKILL)', from PyTorch's words or from the exit code."""
    if killed is not None:
        name = _SIGNAL_NAMES.get(killed.group(1))
        return f"was killed by signal: {killed.group(1)}" + (f" ({name})" if name else "")
    if exit_code is not None and exit_code < 0:
        number = signal.Signals(-exit_code)
        return f"was killed by signal: {signal.strsignal(number)} ({number.name})"
    return "exited unexpectedly" + (f" (exit code {exit_code})" if exit_code is not None else "")


def _exit_codes(trace: TracebackType | None) -> dict[int, int]:
    """pid -> exit code of the workers of the loader iterator that raised (a frame of the traceback):
    PyTorch's liveness check says only "exited unexpectedly", but its iterator holds the processes."""
    codes = {}
    while trace is not None:
        owner = trace.tb_frame.f_locals.get("self")
        if isinstance(owner, _MultiProcessingDataLoaderIter):
            codes.update({worker.pid: worker.exitcode for worker in owner._workers if worker.exitcode is not None})
        trace = trace.tb_next
    return codes
