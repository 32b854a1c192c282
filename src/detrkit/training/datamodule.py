"""RFDETRDataModule: the data set splits and their loaders (sampling, batching, workers)."""

from __future__ import annotations

import functools

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets.collate import collate
from detrkit.datasets.detect import DatasetSplits, build_datasets

# A training epoch draws at least this many optimizer steps' worth of samples from tiny sets.
MIN_STEPS_PER_EPOCH = 5


class RFDETRDataModule(pl.LightningDataModule):
    """Loaders for train/valid/test. The splits are read (and validated) on construction, so that
    a broken data set fails before any training work starts."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig,
                 splits: DatasetSplits | None = None) -> None:
        super().__init__()
        self.model_config, self.train_config = model_config, train_config
        self.splits = splits if splits is not None else build_datasets(train_config, model_config)
        self._collate = functools.partial(collate, block=model_config.block_size)

    @property
    def class_names(self) -> list[str]:
        return self.splits.class_names

    def train_dataloader(self) -> DataLoader:
        config = self.train_config
        window = config.batch_size * config.grad_accum_steps * self._world_size()
        dataset, sampler = self.splits.train, None
        if self._world_size() == 1 and len(dataset) < MIN_STEPS_PER_EPOCH * window:
            sampler = RandomSampler(dataset, replacement=True, num_samples=MIN_STEPS_PER_EPOCH * window)
        else:
            dataset = pad_to_multiple(dataset, window)
        return self._loader(dataset, config.batch_size, shuffle=sampler is None, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.splits.valid, self._eval_batch_size())

    def test_dataloader(self) -> DataLoader:
        if self.splits.test is None:
            raise FileNotFoundError(f"{self.train_config.dataset_dir} has no test split")
        return self._loader(self.splits.test, self._eval_batch_size())

    def _eval_batch_size(self) -> int:
        return self.train_config.eval_batch_size or self.train_config.batch_size

    def _world_size(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool = False, sampler=None,
                drop_last: bool = False) -> DataLoader:
        config = self.train_config
        workers = config.num_workers
        return DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, drop_last=drop_last,
            collate_fn=self._collate, num_workers=workers,
            pin_memory=config.pin_memory if config.pin_memory is not None else torch.cuda.is_available(),
            persistent_workers=(config.persistent_workers if config.persistent_workers is not None
                                else workers > 0) and workers > 0,
            prefetch_factor=(config.prefetch_factor or 2) if workers > 0 else None)


def pad_to_multiple(dataset: Dataset, multiple: int) -> Dataset:
    """Repeat randomly chosen samples (fixed seed) so that the length divides by `multiple`."""
    extra = -len(dataset) % multiple
    if extra == 0:
        return dataset
    generator = torch.Generator().manual_seed(0)
    repeats = torch.randint(len(dataset), (extra,), generator=generator).tolist()
    return Subset(dataset, list(range(len(dataset))) + repeats)
