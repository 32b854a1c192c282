import platform
import resource
from types import SimpleNamespace

import pytest
import torch

from detrkit.config import TrainConfig
from detrkit.training import build_trainer
from detrkit.training.callbacks.heap import RetainHeap, release_freed_memory, retain_freed_memory

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
BLOCK = 16 * 1024 * 1024  # above glibc's default mmap threshold, below the retained one
PAGES = BLOCK // resource.getpagesize()


def faults_to_reallocate(nbytes: int = BLOCK) -> int:
    """Minor page faults taken to write a fresh block right after one of the same size was freed."""
    first = torch.empty(nbytes // 4)
    first.fill_(1.0)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = torch.empty(nbytes // 4)
    again.fill_(2.0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del again
    return faults


@glibc_only
def test_retained_blocks_are_reused_without_page_faults_and_release_restores_the_default():
    try:
        assert retain_freed_memory()
        faults_to_reallocate()  # the heap grows once
        assert faults_to_reallocate() < PAGES // 20
    finally:
        release_freed_memory()
    assert faults_to_reallocate() > PAGES // 2  # mmap again: every page faults in afresh


@glibc_only
def test_callback_retains_for_a_cpu_fit_and_releases_at_its_end(monkeypatch):
    cpu_module = SimpleNamespace(device=torch.device("cpu"))
    callback = RetainHeap()
    try:
        callback.on_fit_start(None, cpu_module)
        assert callback.active
        faults_to_reallocate()
        assert faults_to_reallocate() < PAGES // 20
    finally:
        callback.on_exception(None, cpu_module, RuntimeError("stop"))
    assert not callback.active
    assert faults_to_reallocate() > PAGES // 2

    callback.on_fit_start(None, SimpleNamespace(device=torch.device("cuda", 0)))
    assert not callback.active  # a GPU run's activations are not in this heap
    monkeypatch.setenv("DETRKIT_RETAIN_HEAP", "0")
    callback.on_fit_start(None, cpu_module)
    assert not callback.active


def test_build_trainer_adds_the_callback(tmp_path):
    trainer = build_trainer(TrainConfig(dataset_dir=str(tmp_path), output_dir=str(tmp_path / "out")))
    assert sum(isinstance(c, RetainHeap) for c in trainer.callbacks) == 1
