#!/usr/bin/env python3
"""One side of benchmarks/seg_epoch.py: train RFDETRSegNano for some epochs with either package, timing and
measuring memory with a Lightning callback, then validate once more on its own (run with the package's interpreter).

    PYTHON benchmarks/seg_epoch_side.py --package detrkit|rfdetr --dataset DIR --output DIR \
        [--resolution 312] [--batch-size 4] [--epochs 1] [--threads 2] [--workers 0] [--seed 0] [--ema | --no-ema] \
        [--cprofile FILE]

Both packages expose the same API, so the same code drives both: the model is built with random weights
(pretrain_weights=None) after seeding torch's global RNG, and train() gets the same keywords on both sides
(multi_scale off, default augmentation). `<package>.training.build_trainer` is wrapped to append a timing
callback to the Trainer that train() builds and to keep that Trainer; after train() returns, the same Trainer
validates the trained module once more (`trainer.validate`: forward, mask post-processing, COCO box and mask
mAP), a validation-only pass outside fit.

The mAP metrics logged by each in-fit validation are kept with its epoch (what the learning comparison of
benchmarks/seg_epoch.py reads). Memory is the process's resident-set high-water mark (getrusage ru_maxrss, the main process only: use
--workers 0 to keep data loading in it) read at the callback's marks, with the current RSS beside it.
Prints one JSON line on stdout.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import resource
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MIB = 1024 * 1024


def rss_mib() -> dict[str, float]:
    """Current RSS and the process's RSS high-water mark, MiB."""
    with open("/proc/self/statm") as stream:
        pages = int(stream.read().split()[1])
    return {"rss_mib": pages * os.sysconf("SC_PAGE_SIZE") / MIB,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def map_metrics(metrics) -> dict[str, float]:
    """The mAP entries of a metrics dict (both packages name them `...mAP...` or `...map...`) as floats."""
    return {key: float(value) for key, value in metrics.items() if "mAP" in key or "map" in key}


def make_clock():
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        """Timestamps and memory at the loop boundaries; validation during sanity checks is marked apart."""

        def __init__(self) -> None:
            self.marks: list[dict] = []

        def mark(self, name: str, trainer, **extra) -> None:
            self.marks.append({"event": name, "epoch": trainer.current_epoch, "t": time.perf_counter(),
                               **rss_mib(), **extra})

        def on_fit_start(self, trainer, module) -> None:
            self.mark("fit_start", trainer)

        def on_train_epoch_start(self, trainer, module) -> None:
            self.mark("train_epoch_start", trainer)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.mark("train_batch_end", trainer, batch=batch_idx)

        def on_validation_start(self, trainer, module) -> None:
            self.mark("sanity_start" if trainer.sanity_checking else "validation_start", trainer)

        def on_validation_end(self, trainer, module) -> None:
            self.mark("sanity_end" if trainer.sanity_checking else "validation_end", trainer,
                      metrics=map_metrics(trainer.callback_metrics))

        def on_train_epoch_end(self, trainer, module) -> None:
            self.mark("train_epoch_end", trainer)

        def on_fit_end(self, trainer, module) -> None:
            self.mark("fit_end", trainer)

    return Clock()


def hook_trainer(package: str, clock) -> list:
    """Wrap the package's build_trainer (train() imports it from `<package>.training` when called) so the
    Trainer it builds carries `clock`; the Trainers built are kept in the returned list."""
    training = importlib.import_module(f"{package}.training")
    original = training.build_trainer
    built: list = []

    def build_trainer(*args, **kwargs):
        trainer = original(*args, **kwargs)
        trainer.callbacks.append(clock)
        built.append(trainer)
        return trainer

    training.build_trainer = build_trainer
    return built


def phases(marks: list[dict], start: float) -> dict:
    """Seconds of the training loops, the in-fit validations and the steps, and the memory at their ends."""
    def times(name):
        return [m for m in marks if m["event"] == name]

    epochs = []
    for begin in times("train_epoch_start"):
        epoch = begin["epoch"]
        steps = [m for m in times("train_batch_end") if m["epoch"] == epoch]
        val_start = next((m for m in times("validation_start") if m["epoch"] == epoch and m["t"] > begin["t"]), None)
        val_end = next((m for m in times("validation_end") if m["epoch"] == epoch and m["t"] > begin["t"]), None)
        step_ends = [begin["t"]] + [m["t"] for m in steps]
        epochs.append({
            "epoch": epoch, "steps": len(steps),
            "train_loop_s": (steps[-1]["t"] - begin["t"]) if steps else None,
            "step_s": [b - a for a, b in itertools.pairwise(step_ends)],
            "validation_s": (val_end["t"] - val_start["t"]) if val_start and val_end else None,
            "rss_at_epoch_start_mib": begin["rss_mib"], "max_rss_at_epoch_start_mib": begin["max_rss_mib"],
            "max_rss_after_steps_mib": steps[-1]["max_rss_mib"] if steps else None,
            "rss_after_steps_mib": steps[-1]["rss_mib"] if steps else None,
            "max_rss_after_validation_mib": val_end["max_rss_mib"] if val_end else None,
            "metrics": val_end.get("metrics") if val_end else None})
    sanity = [(e["t"] - s["t"]) for s, e in zip(times("sanity_start"), times("sanity_end"))]
    return {"epochs": epochs, "sanity_validation_s": sanity,
            "marks": [{**m, "t": round(m["t"] - start, 3)} for m in marks]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", choices=["detrkit", "rfdetr"], required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--resolution", type=int, default=312)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--revalidate", action=argparse.BooleanOptionalAction, default=True,
                        help="validate once more with the fitted Trainer after train() (default: on)")
    parser.add_argument("--cprofile", help="profile train() with cProfile and write the stats here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    real_stdout, sys.stdout = sys.stdout, sys.stderr  # the packages' prints go to stderr
    import torch

    torch.set_num_threads(args.threads)
    memory = {"after_import": rss_mib()}
    package = importlib.import_module(args.package)
    clock = make_clock()
    trainers = hook_trainer(args.package, clock)
    torch.manual_seed(args.seed)  # both packages initialise the weights at construction
    model = package.RFDETRSegNano(pretrain_weights=None, device="cpu", resolution=args.resolution)
    memory["after_model"] = rss_mib()
    settings = {"dataset_dir": args.dataset, "output_dir": args.output, "epochs": args.epochs,
                "batch_size": args.batch_size, "num_workers": args.workers, "use_ema": args.ema, "seed": args.seed,
                "multi_scale": False, "tensorboard": False, "progress_bar": None}
    profiler = None
    if args.cprofile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    model.train(**settings)
    train_s = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.cprofile)
    memory["after_train"] = rss_mib()
    result = {"package": args.package, "version": getattr(package, "__version__", None), "seed": args.seed,
              "torch_threads": torch.get_num_threads(), "train_s": train_s, **phases(clock.marks, start)}
    if args.revalidate:
        trainer = trainers[-1]
        clock.marks.clear()
        begin = time.perf_counter()
        metrics = trainer.validate(trainer.lightning_module, datamodule=trainer.datamodule, verbose=False)
        result["revalidate_s"] = time.perf_counter() - begin
        inner = [m["t"] for m in clock.marks if m["event"] in ("validation_start", "validation_end")]
        result["revalidate_loop_s"] = inner[1] - inner[0] if len(inner) == 2 else None
        result["revalidate_metrics"] = map_metrics(metrics[0] if metrics else {})
        memory["after_revalidate"] = rss_mib()
    result["memory"] = memory
    sys.stdout = real_stdout
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
