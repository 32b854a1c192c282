"""EpochMeans: the batch-size weighted epoch means of train/* values, and their checkpoint state."""

import torch

from detrkit.training.epoch_means import EpochMeans


def test_means_are_weighted_by_batch_size_and_start_afresh():
    means = EpochMeans()
    assert not means
    means.add({"a": torch.tensor(1.0), "b": torch.tensor(4.0)}, 2)
    means.add({"a": torch.tensor(4.0)}, 1)
    taken = means.take()
    assert taken["a"].item() == 2.0 and taken["b"].item() == 4.0  # (1*2 + 4*1) / 3
    assert not means and means.take() == {}


def test_state_round_trip_continues_the_sums():
    whole, first = EpochMeans(), EpochMeans()
    values = [({"loss": torch.tensor(v)}, n) for v, n in [(3.0, 2), (0.5, 4), (7.25, 1)]]
    for value, count in values:
        whole.add(value, count)
    for value, count in values[:2]:
        first.add(value, count)
    resumed = EpochMeans()
    resumed.load_state_dict(first.state_dict())
    resumed.add(*values[2])
    assert torch.equal(resumed.take()["loss"], whole.take()["loss"])


def test_reduce_sums_sums_and_counts_over_processes():
    means = EpochMeans()
    means.add({"loss": torch.tensor(2.0)}, 3)
    assert means.take(lambda value: value * 2)["loss"].item() == 2.0  # two processes that saw the same
