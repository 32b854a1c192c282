"""Training sample order and augmentation randomness as pure functions of (seed, epoch).

One global order per epoch is drawn from the run's seed and the epoch number alone; every process
takes its share of each global batch, and every drawn sample carries its own random seed for its
transforms. So the data a step sees depends on neither the number of workers, nor the number of
processes, nor whether the run was resumed in between.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

SampleKey = tuple[int, int]  # (index into the data set, seed of this draw's augmentation)


class EpochSampler(Sampler[SampleKey]):
    """Yields this process's (index, seed) keys of an epoch.

    The global order is a shuffled pass over the data set, padded to a multiple of `window`
    (= batch size x accumulation x processes) with the first indices of one more shuffled pass,
    and at least `min_samples` long. Each window of `window` keys is dealt to the processes in
    contiguous slices of `window // world_size`, rank r taking the r-th slice.
    """

    def __init__(self, size: int, seed: int, window: int, *, rank: int = 0, world_size: int = 1,
                 min_samples: int = 0) -> None:
        if size <= 0:
            raise ValueError("the training split has no images")
        if window % world_size:
            raise ValueError(f"window {window} does not divide among {world_size} processes")
        self.size, self.seed, self.window = size, seed, window
        self.rank, self.world_size, self.min_samples = rank, world_size, min_samples
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, keys of this process to skip), for one pass

    def resume_at(self, epoch: int, skip: int) -> None:
        """The next pass, if it is of `epoch`, starts after this process's first `skip` keys
        (a run resumed from a mid-epoch checkpoint); a pass of another epoch drops the request."""
        self._resume = (epoch, skip)

    @property
    def skipped(self) -> int:
        """How many keys the next pass skips, were it to start now."""
        return self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before each training epoch."""
        self.epoch = epoch

    def global_keys(self) -> list[SampleKey]:
        """The whole epoch's keys, every process's share in order."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        length = max(self.size, self.min_samples)
        length += -length % self.window
        passes = [torch.randperm(self.size, generator=generator) for _ in range(-(-length // self.size))]
        order = torch.cat(passes)[:length].tolist()
        seeds = torch.randint(0, 2**62, (length,), generator=generator).tolist()
        return list(zip(order, seeds))

    def __iter__(self) -> Iterator[SampleKey]:
        keys = self.global_keys()
        share = self.window // self.world_size
        skip, self._resume = self.skipped, None
        mine = (key for start in range(self.rank * share, len(keys), self.window)
                for key in keys[start:start + share])
        yield from itertools.islice(mine, skip, None)

    def __len__(self) -> int:
        length = max(self.size, self.min_samples)
        return (length + -length % self.window) // self.world_size


class SeededSamples(Dataset):
    """Wraps a data set so that `dataset[(index, seed)]` runs its random transforms from `seed`.

    The torch, Python and NumPy global generators are seeded for the call and restored after it,
    so nothing else (training steps, other samples, worker processes) shares their stream.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: SampleKey):
        index, seed = key
        python_state, numpy_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            try:
                return self.dataset[index]
            finally:
                random.setstate(python_state)
                np.random.set_state(numpy_state)

    def __getattr__(self, name: str):  # class_names, coco_ground_truth() and such
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class EpochTagged(Sampler[tuple[int, int, int]]):
    """Yields the keys of an EpochSampler with its epoch appended, (index, seed, epoch), for data
    sets whose samples change with the epoch (mosaic and mixup stop for the last epochs). The
    epoch travels with each key, so loader workers need no shared state to know it."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def resume_at(self, epoch: int, skip: int) -> None:
        self.sampler.resume_at(epoch, skip)

    @property
    def skipped(self) -> int:
        return self.sampler.skipped

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        epoch = self.sampler.epoch
        for index, seed in self.sampler:
            yield index, seed, epoch

    def __len__(self) -> int:
        return len(self.sampler)
