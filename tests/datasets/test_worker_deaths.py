"""The loading table is shared with loader workers, and PyTorch's reports of a dead worker become
SampleWorkerKilled naming the sample that worker was loading. (The kill itself, in a training run:
tests/training/test_faults.py.)"""

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from detrkit.datasets.detection import DetectionDataset, ImageRecord, SampleLoadError
from detrkit.datasets.loading_slots import IDLE, LoadingSlots
from detrkit.datasets.worker_deaths import SampleWorkerKilled, worker_death


class Peek(Dataset):
    """Returns the table as the worker sees it while loading `index`."""

    def __init__(self, slots: LoadingSlots) -> None:
        self.slots = slots

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> torch.Tensor:
        with self.slots.loading(index):
            return self.slots.table.clone()


def test_workers_write_their_row_of_the_shared_table():
    slots = LoadingSlots(2)
    seen = list(DataLoader(Peek(slots), batch_size=None, num_workers=2))
    pids = {int(table[index % 2, 1]) for index, table in enumerate(seen)}  # workers take indices in turn
    assert len(pids) == 2 and os.getpid() not in pids
    for index, table in enumerate(seen):
        assert int(table[index % 2, 0]) == index  # its own row named the sample while it loaded it
    assert slots.table[:, 0].tolist() == [IDLE, IDLE]  # cleared after, as the main process sees it
    assert {int(pid) for pid in slots.table[:, 1]} == pids
    with slots.loading(7):  # the main process records nothing: its errors name themselves
        assert slots.table[:, 0].tolist() == [IDLE, IDLE]


def one_image_dataset() -> DetectionDataset:
    record = ImageRecord(Path("/data/train/cat.jpg"), 42, np.zeros((0, 4), np.float32), np.zeros(0, np.int64),
                         np.zeros(0, bool))
    dataset = DetectionDataset([record, record], ["cat"], transform=None)
    dataset.slots = LoadingSlots(2)
    dataset.slots.table[1] = torch.tensor([1, 4321])  # worker 1, pid 4321, is loading sample 1
    dataset.slots.table[0, 1] = 1234  # worker 0 is between samples
    return dataset


def test_pytorch_reports_of_a_dead_worker_name_its_sample():
    dataset = one_image_dataset()
    killed = worker_death(RuntimeError("DataLoader worker (pid 4321) is killed by signal: Segmentation fault. "),
                          [dataset])
    assert isinstance(killed, SampleWorkerKilled) and isinstance(killed, SampleLoadError)
    assert str(killed).startswith("data loader worker (pid 4321) was killed by signal: Segmentation fault "
                                  "(SIGSEGV) while loading data set sample 1 (image id 42, file /data/train/cat.jpg)")
    exited = worker_death(RuntimeError("DataLoader worker (pid(s) 1234, 4321) exited unexpectedly"), [dataset])
    assert str(exited).startswith("data loader worker (pid 4321) exited unexpectedly while loading data set "
                                  "sample 1 (image id 42")
    assert str(exited).endswith("PyTorch said: DataLoader worker (pid(s) 1234, 4321) exited unexpectedly")


def test_other_errors_and_idle_workers_stay_as_they_are():
    dataset = one_image_dataset()
    assert worker_death(RuntimeError("DataLoader worker (pid 1234) is killed by signal: Killed."), [dataset]) is None
    assert worker_death(RuntimeError("CUDA out of memory"), [dataset]) is None


class Dying(Dataset):
    """Its worker SIGKILLs itself on sample 2, marked as loading it."""

    def __init__(self) -> None:
        self.slots = LoadingSlots(1)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        with self.slots.loading(index):
            if index == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return index

    def sample_name(self, index: int) -> str:
        return f"sample {index}"


def test_a_real_kill_names_the_signal_whichever_check_of_pytorch_saw_it():
    # PyTorch reports a dead worker from its SIGCHLD handler (naming the signal) or from its liveness
    # check (not naming it), whichever runs first; the exit code in its iterator names it then
    dataset = Dying()
    with pytest.raises(RuntimeError) as raised:
        list(DataLoader(dataset, batch_size=None, num_workers=1))
    killed = worker_death(raised.value, [dataset])
    assert ") was killed by signal: Killed (SIGKILL) while loading sample 2. " in str(killed), str(raised.value)
