"""RFDETRDataModule: the data set splits and their loaders (sampling, batching, workers)."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.augmentation import build_augmentation
from detrkit.datasets.collate import collate
from detrkit.datasets.detect import DatasetSplits, build_datasets
from detrkit.datasets.detection import DetectionDataset
from detrkit.datasets.loading_slots import LoadingSlots
from detrkit.datasets.mixing import MixedSamples
from detrkit.datasets.worker_deaths import naming_worker_deaths
from detrkit.structures import Batch
from detrkit.training.auto_batch import require_integer_batch
from detrkit.training.sampling import EpochSampler, EpochTagged, SeededSamples

# A training epoch draws at least this many optimizer steps' worth of samples from tiny sets.
MIN_STEPS_PER_EPOCH = 5


class PaddingShare(list):
    """The evaluation indices of a process that has no image of its own: run, never scored."""


class EpochLoader(DataLoader):
    """The training loader: its pass over the epoch starts at its first batch rather than at
    iter(), and it can resume a pass in the middle (Lightning's stateful-loader interface).

    A resumed run's first iter() comes before Lightning's set_epoch; loader workers take their
    first keys as their iterator starts, so they would train that epoch on epoch 0's order.
    `state_dict()` is the epoch of the current pass and the batches it has handed out (Lightning
    fetches none ahead of the step when the loader has a length, so that many were trained on);
    `load_state_dict()` makes the next pass of that epoch skip them without loading them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pass = {"epoch": 0, "batches": 0}

    def __iter__(self):
        return _StartsAtFirstBatch(self)

    def state_dict(self) -> dict[str, int]:
        return dict(self._pass)

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        epoch, batches = int(state_dict["epoch"]), int(state_dict["batches"])
        if 0 < batches < len(self):  # a pass that ended needs no skipping
            self.sampler.resume_at(epoch, batches * self.batch_size)
            self._pass = {"epoch": epoch, "batches": batches}


class _StartsAtFirstBatch:
    def __init__(self, loader: EpochLoader) -> None:
        self._loader, self._iterator = loader, None

    def __iter__(self):
        return self

    def __next__(self):
        loader = self._loader
        if self._iterator is None:
            sampler = loader.sampler
            loader._pass = {"epoch": sampler.epoch, "batches": sampler.skipped // loader.batch_size}
            # a new iterator draws its workers' base seed from the global generator; a resumed pass
            # must leave that generator as the checkpoint had it, where the step goes on
            with torch.random.fork_rng(devices=[], enabled=loader._pass["batches"] > 0):
                self._iterator = DataLoader.__iter__(loader)
        batch = next(self._iterator)
        loader._pass["batches"] += 1
        return batch


class RFDETRDataModule(pl.LightningDataModule):
    """Loaders for train/valid/test. The splits are read (and validated) on construction, so that
    a broken data set fails before any training work starts.

    The training order and augmentation draws follow `sample_seed` (the run's seed, else a random
    one) and the epoch number only; the seed is saved in checkpoints so that a resumed run sees the
    same data as an uninterrupted one.
    """

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig,
                 splits: DatasetSplits | None = None) -> None:
        super().__init__()
        require_integer_batch(train_config)
        if train_config.pad_targets_to is not None:
            raise NotImplementedError(f"pad_targets_to={train_config.pad_targets_to}: padding targets to a fixed "
                                      f"row count (for XLA) is not implemented; leave it None")
        self.model_config, self.train_config = model_config, train_config
        self.splits = splits if splits is not None else build_datasets(train_config, model_config)
        self._collate = functools.partial(collate, block=model_config.block_size)
        self.sample_seed = train_config.seed if train_config.seed is not None else secrets.randbelow(2**31)
        self._train_loader: EpochLoader | None = None  # the last one train_dataloader() made
        self._loader_state: dict[str, int] | None = None  # its place in an epoch, from a checkpoint
        # the Kornia backend augments and normalises training batches on their device; others: None
        self.batch_augment = build_augmentation(train_config, self.splits.keypoint_flip).batch_augment()

    @property
    def class_names(self) -> list[str]:
        return self.splits.class_names

    def setup(self, stage: str) -> None:
        if self.trainer is not None and self.trainer.world_size > 1:  # one order for all processes
            self.sample_seed = self.trainer.strategy.broadcast(self.sample_seed, src=0)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"sample_seed": self.sample_seed}
        if self._train_loader is not None:  # where its pass stands, for a checkpoint written mid-epoch
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored before or after the training loader is made (Lightning makes it early when
        the LR schedule needs the step count), so the loader's place waits for it if need be."""
        self.sample_seed = int(state_dict["sample_seed"])
        self._loader_state = state_dict.get("train_loader")
        if self._train_loader is not None and self._loader_state is not None:
            self._train_loader.load_state_dict(self._loader_state)

    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        if self.batch_augment is not None and self.trainer is not None and self.trainer.training:
            return self.batch_augment(batch)
        return batch

    def train_sampler(self) -> EpochSampler:
        config = self.train_config
        rank, world_size = self._placement()
        window = config.batch_size * config.grad_accum_steps * world_size
        return EpochSampler(len(self.splits.train), self.sample_seed, window, rank=rank, world_size=world_size,
                            min_samples=MIN_STEPS_PER_EPOCH * window)

    def naming_worker_deaths(self) -> contextlib.AbstractContextManager:
        """Inside, a loader worker killed while loading a sample raises SampleWorkerKilled naming it."""
        return naming_worker_deaths([split for split in (self.splits.train, self.splits.valid, self.splits.test)
                                     if split is not None])

    def train_dataloader(self) -> DataLoader:
        config = self.train_config
        self._watch(self.splits.train)
        samples, sampler = SeededSamples(self.splits.train), self.train_sampler()
        if config.mosaic or config.mixup:  # the last close_mosaic_epochs train on plain samples
            samples = MixedSamples(samples, config.mosaic, config.mixup, config.epochs - config.close_mosaic_epochs)
            sampler = EpochTagged(sampler)
        self._train_loader = self._loader(samples, config.batch_size, sampler=sampler, drop_last=True, kind=EpochLoader)
        if self._loader_state is not None:
            self._train_loader.load_state_dict(self._loader_state)
        return self._train_loader

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.splits.valid)

    def test_dataloader(self) -> DataLoader:
        if self.splits.test is None:
            raise FileNotFoundError(f"{self.train_config.dataset_dir} has no test split")
        return self._eval_loader(self.splits.test)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        """Each process scores its own slice (rank, rank + world, ...): no sample twice. A process
        left without images (fewer than processes) gets image 0 as a PaddingShare, which it runs
        but does not score: Lightning refuses an empty loader on one process, and every process
        must take part in the evaluation's collectives."""
        self._watch(dataset)
        rank, world_size = self._placement()
        indices = list(range(rank, len(dataset), world_size))
        if not indices and len(dataset):
            indices = PaddingShare([0])
        batch_size = self.train_config.eval_batch_size or self.train_config.batch_size
        return self._loader(dataset, batch_size, sampler=indices)

    def _placement(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def _on_cuda(self) -> bool:
        if self.trainer is None:
            return torch.cuda.is_available()
        return self.trainer.strategy.root_device.type == "cuda"

    def _workers(self) -> int:
        if self.train_config.num_workers is not None:
            return self.train_config.num_workers
        processes = self.trainer.world_size // self.trainer.num_nodes if self.trainer is not None else 1
        return default_num_workers(self._on_cuda(), processes)

    def _watch(self, dataset: DetectionDataset) -> None:
        """A table of what each of the data set's loader workers loads, made before they start."""
        if len(dataset.slots) != self._workers():
            dataset.slots = LoadingSlots(self._workers())

    def _loader(self, dataset: Dataset, batch_size: int, sampler, drop_last: bool = False,
                kind: type[DataLoader] = DataLoader) -> DataLoader:
        config, on_cuda, workers = self.train_config, self._on_cuda(), self._workers()
        return kind(
            dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
            collate_fn=self._collate, num_workers=workers,
            pin_memory=config.pin_memory if config.pin_memory is not None else on_cuda,
            persistent_workers=(config.persistent_workers if config.persistent_workers is not None
                                else workers > 0) and workers > 0,
            prefetch_factor=(config.prefetch_factor or 2) if workers > 0 else None)


def default_num_workers(on_cuda: bool, processes_per_node: int = 1) -> int:
    """Loader workers when num_workers is not set: 2 on the CPU, where they share the cores with the
    training step; on CUDA the host only feeds the GPU, so one per core this process can claim
    (one left for the main process), between 2 and 8."""
    if not on_cuda:
        return 2
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(2, min(8, cores // max(1, processes_per_node) - 1))
