"""ThroughputProbe: a Lightning callback that times windows of training batches, reads peak memory and
profiles a few steps for the GPU busy fraction, the same way for any package's trainer.

Imported by benchmarks/gpu_train.py in detrkit's and in the reference's interpreter alike, so it needs
only torch and pytorch_lightning.

Timeline of batch indices (N = window_steps, W = warm-up windows, T = timed windows, P = profiled steps):

    0 .. W*N-1           warm-up windows (timed, reported, not in the median)
    W*N .. (W+T)*N-1     timed windows: the median images/s comes from these
    (W+T)*N              peak memory is read at its start (after the timed steps), the profiler starts
    (W+T)*N + P          the profiler stops at its start: the run needs `steps_needed` batches in all

Window edges are the starts of batches 0, N, 2N, ...: consecutive windows share their edges, so the
time between batches (data loading, EMA updates, logging) is counted, and the only host syncs the probe
adds are one `torch.cuda.synchronize()` per edge.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

MIB = 2**20


class ThroughputProbe(pl.Callback):
    def __init__(self, batch_size: int, window_steps: int, warmup_windows: int, windows: int,
                 profile_steps: int) -> None:
        self.batch_size, self.window_steps = batch_size, window_steps
        self.warmup_windows, self.windows, self.profile_steps = warmup_windows, windows, profile_steps
        self.edges: list[float] = []  # perf_counter at the window edges
        self.step = 0
        self.first_batch_at: float | None = None  # time.time() at the start of batch 0
        self.cuda = False
        self.memory: dict[str, float | None] = {"peak_allocated_mib": None, "peak_reserved_mib": None}
        self.profile: dict[str, Any] = {}
        self.trainer_facts: dict[str, Any] = {}
        self._profiler: torch.profiler.profile | None = None
        self._profile_start = 0.0

    @property
    def timed_steps(self) -> int:
        return (self.warmup_windows + self.windows) * self.window_steps

    @property
    def steps_needed(self) -> int:
        """Batches the run must reach: the timed ones, the profiled ones and one to close the profile."""
        return self.timed_steps + self.profile_steps + 1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.cuda = pl_module.device.type == "cuda"
        loader = trainer.train_dataloader
        self.trainer_facts = {
            "precision": str(trainer.precision),
            "num_workers": loader.num_workers if isinstance(loader, torch.utils.data.DataLoader) else None,
            "callbacks": [type(callback).__name__ for callback in trainer.callbacks],
            "max_steps": trainer.max_steps, "limit_val_batches": trainer.limit_val_batches,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "gradient_clip_val": trainer.gradient_clip_val,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
        }

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step, self.step = self.step, self.step + 1
        if step == 0:
            self.first_batch_at = time.time()
        if step <= self.timed_steps and step % self.window_steps == 0:
            self._sync()
            self.edges.append(time.perf_counter())
        if step == self.timed_steps:
            self._read_memory()
            if self.profile_steps:
                self._start_profile()
        elif step == self.timed_steps + self.profile_steps and self._profiler is not None:
            self._stop_profile()

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _read_memory(self) -> None:
        if self.cuda:
            self.memory = {"peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
                           "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB}

    def _start_profile(self) -> None:
        activity = torch.profiler.ProfilerActivity.CUDA if self.cuda else torch.profiler.ProfilerActivity.CPU
        self._profiler = torch.profiler.profile(activities=[activity])
        self._profiler.start()
        self._profile_start = time.perf_counter()  # the edge above synchronised already

    def _stop_profile(self) -> None:
        self._sync()
        wall = time.perf_counter() - self._profile_start
        self._profiler.stop()
        with tempfile.TemporaryDirectory() as scratch:
            trace = Path(scratch) / "trace.json"
            self._profiler.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text()).get("traceEvents", [])
        self._profiler = None
        self.profile = {"profiled_steps": self.profile_steps, "profile_wall_s": wall, **device_busy(events, wall)}
        if self.cuda and not self.profile["kernels"]:
            self.profile["profile_note"] = "no kernel events in the CUDA-only trace: busy fraction unknown"

    def result(self) -> dict[str, Any]:
        """Window times, images/s (all windows; median of the timed ones), memory and profile."""
        seconds = [later - earlier for earlier, later in zip(self.edges, self.edges[1:])]
        rates = [self.window_steps * self.batch_size / s for s in seconds]
        timed = rates[self.warmup_windows:]
        return {"window_steps": self.window_steps, "warmup_windows": self.warmup_windows,
                "timed_windows": len(timed), "window_seconds": seconds, "window_images_per_s": rates,
                "images_per_s": statistics.median(timed) if timed else None,
                "complete": len(timed) == self.windows and bool(self.profile or not self.profile_steps),
                **self.memory, **self.profile, **self.trainer_facts}


def device_busy(events: list[dict], wall_s: float) -> dict[str, Any]:
    """GPU kernel time in a Chrome trace over its wall time: busy_fraction sums kernel durations (the
    definition the benchmark reports); busy_union_fraction merges overlapping kernels (streams)."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                   for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")
    total = sum(end - start for start, end in spans)
    union, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            union += end - max(start, reach)
            reach = end
    wall_us = wall_s * 1e6
    return {"kernels": len(spans), "kernel_s": total / 1e6,
            "busy_fraction": total / wall_us if spans else None,
            "busy_union_fraction": union / wall_us if spans else None}
