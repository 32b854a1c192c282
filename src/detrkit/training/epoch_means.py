"""The epoch means of the train/* values, kept by the module so that a checkpoint written in the
middle of an epoch (Ctrl-C) carries them: Lightning's own on_epoch sums live in its private
result collection, which no checkpoint holds, so a resumed epoch's means would cover only its
resumed part."""

from __future__ import annotations

from typing import Any

import torch


class EpochMeans:
    """Batch-size weighted sums of named values, as Lightning's mean reduction keeps them (float32
    sums on the values' device, so adding costs no host sync)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, torch.Tensor], batch_size: int) -> None:
        for name, value in values.items():
            weighted = value.detach().float() * batch_size
            self.sums[name] = self.sums[name].to(weighted.device) + weighted if name in self.sums else weighted
            self.counts[name] = self.counts.get(name, 0) + batch_size

    def __bool__(self) -> bool:
        return bool(self.sums)

    def take(self, reduce=None) -> dict[str, torch.Tensor]:
        """The means, and empty sums for the next epoch. `reduce(tensor)` sums a tensor over the
        processes (train_log_sync_dist); every process must then call this."""
        means = {}
        for name, total in self.sums.items():
            count = total.new_tensor(float(self.counts[name]))
            if reduce is not None:
                total, count = reduce(total), reduce(count)
            means[name] = total / count
        self.sums, self.counts = {}, {}
        return means

    def state_dict(self) -> dict[str, Any]:
        return {"sums": {name: value.cpu() for name, value in self.sums.items()}, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums = dict(state["sums"])  # moved to the values' device by the next add()
        self.counts = {name: int(count) for name, count in state["counts"].items()}
