"""EpochSampler: one global order per (seed, epoch), dealt to processes; SeededSamples streams."""

import random

import pytest
import torch
from torch.utils.data import Dataset

from detrkit.training.sampling import EpochSampler, SeededSamples


def test_order_is_a_function_of_seed_and_epoch_only():
    a, b = EpochSampler(10, seed=3, window=4), EpochSampler(10, seed=3, window=4)
    torch.manual_seed(123)  # the global generator plays no part
    first = list(a)
    torch.manual_seed(456)
    assert list(b) == first
    a.set_epoch(1)
    assert list(a) != first
    assert list(EpochSampler(10, seed=4, window=4)) != first


def test_each_epoch_covers_the_data_set_padded_to_whole_windows():
    sampler = EpochSampler(10, seed=0, window=4)
    keys = list(sampler)
    assert len(keys) == len(sampler) == 12
    indices = [index for index, _ in keys]
    assert sorted(indices[:10]) == list(range(10))  # one full pass, then padding
    assert len({seed for _, seed in keys}) == 12  # every draw has its own augmentation seed


def test_tiny_sets_repeat_passes_up_to_the_minimum():
    sampler = EpochSampler(3, seed=0, window=2, min_samples=10)
    indices = [index for index, _ in sampler]
    assert len(indices) == 10
    for start in (0, 3, 6):
        assert sorted(indices[start:start + 3]) == [0, 1, 2]


@pytest.mark.parametrize("world_size", [2, 4])
def test_processes_share_each_global_batch(world_size):
    batch = 2
    single = EpochSampler(13, seed=5, window=batch * world_size)
    global_keys = list(single)
    shares = [list(EpochSampler(13, seed=5, window=batch * world_size, rank=r, world_size=world_size))
              for r in range(world_size)]
    assert all(len(share) == len(global_keys) // world_size for share in shares)
    for step in range(len(global_keys) // (batch * world_size)):
        together = [key for share in shares for key in share[step * batch:(step + 1) * batch]]
        assert together == global_keys[step * batch * world_size:(step + 1) * batch * world_size]


def test_window_must_divide_among_processes():
    with pytest.raises(ValueError, match="window 3"):
        EpochSampler(10, seed=0, window=3, world_size=2)


class Draws(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return index, torch.rand(()).item(), random.random()


def test_seeded_samples_are_reproducible_and_leave_the_global_streams_alone():
    samples = SeededSamples(Draws())
    torch.manual_seed(0)
    random.seed(0)
    before = torch.get_rng_state(), random.getstate()
    first = samples[(2, 99)]
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    torch.manual_seed(1)
    assert samples[(2, 99)] == first
    assert samples[(2, 100)] != first
    assert len(samples) == 4


def test_loader_workers_do_not_change_what_a_step_sees():
    from torch.utils.data import DataLoader

    def epoch(workers: int) -> list:
        sampler = EpochSampler(4, seed=7, window=2)
        sampler.set_epoch(3)
        loader = DataLoader(SeededSamples(Draws()), batch_size=2, sampler=sampler, num_workers=workers,
                            collate_fn=list)
        return [item for batch in loader for item in batch]

    assert epoch(2) == epoch(0)


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_resumed_pass_skips_what_was_trained_in_that_epoch_only(world_size):
    full = EpochSampler(10, seed=1, window=4, rank=world_size - 1, world_size=world_size)
    full.set_epoch(2)
    keys = list(full)
    sampler = EpochSampler(10, seed=1, window=4, rank=world_size - 1, world_size=world_size)
    sampler.resume_at(2, 4)
    sampler.set_epoch(2)
    assert sampler.skipped == 4
    assert list(sampler) == keys[4:]
    assert sampler.skipped == 0 and list(sampler) == keys  # one pass only
    sampler.resume_at(1, 4)  # the resumed epoch is another: nothing skipped, request dropped
    assert list(sampler) == keys and sampler.skipped == 0


def test_the_training_loader_resumes_its_pass_where_the_checkpoint_left_it():
    from detrkit.training.datamodule import EpochLoader

    def loader() -> EpochLoader:
        sampler = EpochSampler(4, seed=5, window=2, min_samples=8)  # 4 batches
        sampler.set_epoch(1)
        return EpochLoader(SeededSamples(Draws()), batch_size=2, sampler=sampler, collate_fn=list)

    whole = loader()
    batches = list(whole)
    assert whole.state_dict() == {"epoch": 1, "batches": len(batches)}
    cut = loader()
    seen = iter(cut)
    taken = [next(seen), next(seen)]
    state = cut.state_dict()
    assert state == {"epoch": 1, "batches": 2}
    resumed = loader()
    resumed.load_state_dict(state)
    torch.manual_seed(0)
    expected_rng = torch.get_rng_state()
    rest = list(resumed)
    assert taken + rest == batches
    assert torch.equal(torch.get_rng_state(), expected_rng)  # the resumed pass drew no base seed
    assert resumed.state_dict() == {"epoch": 1, "batches": len(batches)}
    ended = loader()
    ended.load_state_dict({"epoch": 1, "batches": len(batches)})  # an ended pass: the next one is whole
    assert list(ended) == batches
