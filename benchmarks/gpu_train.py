#!/usr/bin/env python3
"""Training speed of detrkit beside the reference rfdetr: images/s, peak memory and GPU busy fraction
per (package, variant, batch size), one process each, measured by one harness through each package's
public train().

    python benchmarks/gpu_train.py drive --out benchmarks/results/gpu_train.json [--device cuda] \\
        [--configs nano:4 nano:64 medium:16] [--packages detrkit reference] \\
        [--detrkit-python PY] [--detrkit-pythonpath PATH] [--reference-python PY] [--reference-pythonpath PATH] \\
        [--train-kwargs '{"num_workers": 8}'] [--run-timeout 120] [--log runs.log] [--smoke]
    python benchmarks/gpu_train.py run --package detrkit --variant nano --batch-size 4 --dataset DIR --json-out F
    python benchmarks/gpu_train.py summary RESULT.json

`drive` writes one synthetic COCO folder (benchmarks/coco_shards.py: make_synthetic_dataset shards
written in parallel, then merged), then runs `run` once per configuration and package, in turn, each
in a fresh interpreter (`--<package>-python`, with PYTHONPATH `--<package>-pythonpath` when given).
`run` trains one epoch with each package's defaults (precision, multi-scale, EMA; progress bar and
TensorBoard off on both sides, pretrain_weights=None), with validation off (`limit_val_batches=0`)
and `max_steps` just past the measured batches, so checkpoints are written after them. The ThroughputProbe callback
(benchmarks/throughput_probe.py) goes in through detrkit's train(callbacks=[...]) Trainer passthrough;
the reference's train() takes no Trainer arguments, so `run` wraps the `build_trainer` that its train()
imports from `rfdetr.training`: the same Trainer, with max_steps/limit_val_batches and the probe added.

The JSON holds, per configuration and package, the window times and images/s (median over the timed
windows), peak allocated/reserved MiB after the timed steps, the busy fraction of the profiled steps,
startup seconds (process launch to the first batch) and versions; per configuration the ratios
detrkit/reference; and the fraction of the compute floor, `peak_tflops` over the FLOPs of one training
image (`--flops-per-image` GFLOP for Nano at 384 px; the count measured on detrkit's model, forward and
backward at the nominal resolution, for the others).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGES = ("detrkit", "reference")
CLASS_NAMES = {"nano": "RFDETRNano", "small": "RFDETRSmall", "medium": "RFDETRMedium", "large": "RFDETRLarge"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    drive, run = modes.add_parser("drive"), modes.add_parser("run")
    for sub in (drive, run):
        sub.add_argument("--device", default="cuda")
        sub.add_argument("--train-kwargs", default="{}", help="JSON: further train() keywords for both packages")
        sub.add_argument("--window-images", type=int, default=96, help="a window has >= this many images")
        sub.add_argument("--min-window-steps", type=int, default=4)
        sub.add_argument("--warmup-windows", type=int, default=2)
        sub.add_argument("--windows", type=int, default=6, help="timed windows")
        sub.add_argument("--profile-steps", type=int, default=3)
        sub.add_argument("--resolution", type=int, help="override the variant's default resolution")
        sub.add_argument("--smoke", action="store_true", help="tiny settings, for a CPU check of the harness")
    drive.add_argument("--out", type=Path, default=HERE / "results" / "gpu_train.json")
    drive.add_argument("--configs", nargs="+", help="VARIANT:BATCH (default nano:4 nano:64 medium:16)")
    drive.add_argument("--packages", nargs="+", choices=PACKAGES, default=list(PACKAGES))
    for package in PACKAGES:
        drive.add_argument(f"--{package}-python", default=sys.executable)
        drive.add_argument(f"--{package}-pythonpath", help="PYTHONPATH of its runs (default: inherited)")
    drive.add_argument("--dataset", type=Path, help="a COCO folder to use instead of writing one")
    drive.add_argument("--image-size", type=int, nargs=2, default=(640, 480), metavar=("W", "H"))
    drive.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="for writing the data set")
    drive.add_argument("--run-timeout", type=float, help="seconds per run (default 120; 900 with --smoke)")
    drive.add_argument("--budget", type=float, help="seconds for the whole drive: runs are cut to fit, or skipped")
    drive.add_argument("--log", type=Path, help="append every run's output here (default: beside --out)")
    drive.add_argument("--flops-per-image", type=float, default=170.0, help="GFLOP per Nano training image")
    drive.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 TFLOP/s of the GPU")
    run.add_argument("--package", choices=PACKAGES, required=True)
    run.add_argument("--variant", choices=sorted(CLASS_NAMES), required=True)
    run.add_argument("--batch-size", type=int, required=True)
    run.add_argument("--dataset", type=Path, required=True)
    run.add_argument("--json-out", type=Path, required=True)
    run.add_argument("--launched-at", type=float, help="time.time() when the driver started this process")
    run.add_argument("--count-flops", action="store_true", help="also count one image's training FLOPs")
    summary = modes.add_parser("summary")
    summary.add_argument("result", type=Path)
    args = parser.parse_args()
    if getattr(args, "smoke", False):
        args.window_images, args.min_window_steps, args.warmup_windows, args.windows = 1, 1, 1, 2
        args.profile_steps, args.resolution = 1, args.resolution or 128
    if args.mode == "drive":
        args.run_timeout = args.run_timeout or (900.0 if args.smoke else 120.0)
    return args


def window_steps(args: argparse.Namespace, batch_size: int) -> int:
    return max(args.min_window_steps, math.ceil(args.window_images / batch_size))


def steps_needed(args: argparse.Namespace, batch_size: int) -> int:
    """Batches a run reaches: warm-up and timed windows, profiled steps and one to close the profile."""
    return (args.warmup_windows + args.windows) * window_steps(args, batch_size) + args.profile_steps + 1


# ---------------------------------------------------------------- one configuration, one package


def run_one(args: argparse.Namespace) -> int:
    """Train one configuration with the probe attached; write its measurements to --json-out, also
    when the driver stops the run early (SIGTERM) or training fails."""
    import warnings

    import torch

    sys.path.insert(0, str(HERE))
    from throughput_probe import ThroughputProbe

    launched = args.launched_at or time.time()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds train(), so the result is written
    probe = ThroughputProbe(args.batch_size, window_steps(args, args.batch_size), args.warmup_windows,
                            args.windows, args.profile_steps)
    torch.manual_seed(0)
    model = build_model(args)
    trainer_args = {"max_steps": probe.steps_needed, "limit_val_batches": 0}
    settings = {"dataset_dir": str(args.dataset), "epochs": 1, "batch_size": args.batch_size, "seed": 0,
                "device": args.device, "tensorboard": False, "progress_bar": None, **json.loads(args.train_kwargs)}
    result: dict[str, Any] = {"package": args.package, "variant": args.variant, "batch_size": args.batch_size,
                              "train_kwargs": settings, "trainer_args": trainer_args}
    called = time.time()
    error = train_with_probe(model, args.package, settings, trainer_args, probe)
    result.update(probe.result(), train_call_s=time.time() - called, versions=versions(args.package))
    if error:
        result["error"] = error
    if probe.first_batch_at is not None:
        result.update(startup_s=probe.first_batch_at - launched,
                      train_call_to_first_batch_s=probe.first_batch_at - called)
    if args.count_flops and not error:
        result["measured_gflop_per_image"] = training_gflop_per_image(model, args.device)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if error else 0


def train_with_probe(model, package: str, settings: dict[str, Any], trainer_args: dict[str, Any],
                     probe) -> str | None:
    """One train() call into a scratch output folder; the error that ended it early, if any."""
    with tempfile.TemporaryDirectory() as output:
        try:
            if package == "detrkit":
                model.train(**settings, output_dir=output, **trainer_args, callbacks=[probe])
            else:
                with reference_trainer_hook(trainer_args, probe):
                    model.train(**settings, output_dir=output)
        except SystemExit:
            return "stopped by the driver (--run-timeout or --budget)"
        except Exception as error:  # keep what was measured before the failure
            return f"{type(error).__name__}: {error}"
    return None


def build_model(args: argparse.Namespace):
    """The package's preset for the variant, randomly initialised (no weights download)."""
    if args.package == "detrkit":
        import detrkit as package
    else:
        import rfdetr as package
    kwargs = {"pretrain_weights": None, "device": args.device}
    if args.resolution:
        kwargs["resolution"] = args.resolution
    return getattr(package, CLASS_NAMES[args.variant])(**kwargs)


@contextlib.contextmanager
def reference_trainer_hook(trainer_args: dict[str, Any], probe):
    """rfdetr's train() builds its Trainer with `from rfdetr.training import build_trainer` and passes
    it no Trainer arguments: swap that name for a wrapper that adds ours and appends the probe."""
    import rfdetr.training as training

    original = training.build_trainer

    def build_trainer(train_config, model_config, **kwargs):
        trainer = original(train_config, model_config, **{**kwargs, **trainer_args})
        trainer.callbacks.append(probe)
        return trainer

    training.build_trainer = build_trainer
    try:
        yield
    finally:
        training.build_trainer = original


def training_gflop_per_image(model, device: str) -> float:
    """FLOPs of one training forward + backward of detrkit's detector (all query groups) for one
    image at the nominal resolution, as torch's FLOP counter counts them."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    detector = model.model.train()
    side = model.model_config.resolution
    pixels = torch.randn(1, model.model_config.num_channels, side, side, device=device)
    with FlopCounterMode(display=False) as counter:
        out = detector(pixels)
        (out.pred_logits.float().sum() + out.pred_boxes.float().sum()).backward()
    detector.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 1e9


def versions(package: str) -> dict[str, Any]:
    import importlib.metadata
    import platform

    import pytorch_lightning
    import torch

    name = "detrkit" if package == "detrkit" else "rfdetr"
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "source tree"
    cuda = torch.cuda.is_available()
    return {"package": f"{name} {version}", "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if cuda else None,
            "lightning": pytorch_lightning.__version__, "gpu": torch.cuda.get_device_name(0) if cuda else None}


# ---------------------------------------------------------------- the driver


def drive(args: argparse.Namespace) -> int:
    """Every configuration for every package, in turn; the JSON is rewritten after each run."""
    args.deadline = time.time() + args.budget if args.budget else math.inf
    # a SIGTERM (from `timeout`) becomes SystemExit, on which launch() stops the run in flight
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    configs = args.configs or (["nano:2"] if args.smoke else ["nano:4", "nano:64", "medium:16"])
    pairs = [(variant, int(batch)) for variant, batch in (config.split(":") for config in configs)]
    log = args.log or args.out.with_suffix(".log")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    result = settings_record(args, configs)
    sys.path.insert(0, str(HERE))
    from coco_shards import write_dataset

    with tempfile.TemporaryDirectory() as scratch:
        dataset = args.dataset
        if dataset is None:
            needed = max((steps_needed(args, batch) + 1) * batch for _, batch in pairs)
            started = time.perf_counter()
            size = (320, 240) if args.smoke else tuple(args.image_size)
            dataset = write_dataset(Path(scratch) / "data", needed, 4 if args.smoke else 16, size, args.processes)
            result["dataset"] = {"train_images": needed, "image_size": size,
                                 "seconds_to_write": time.perf_counter() - started}
        counted: set[str] = set()
        for variant, batch in pairs:
            name = f"{variant}:{batch}"
            for package in args.packages:
                count = package == "detrkit" and variant not in counted  # FLOPs once per variant
                if count:
                    counted.add(variant)
                run = launch(args, package, variant, batch, dataset, Path(scratch), log, count)
                result["runs"].setdefault(name, {})[package] = run
                result["comparison"][name] = compare(result["runs"][name], variant, args, result["runs"])
                args.out.write_text(json.dumps(result, indent=2) + "\n")
                print(f"{name} {package}: {brief(run)}", file=sys.stderr, flush=True)
    print(table(result))
    return 0


def settings_record(args: argparse.Namespace, configs: list[str]) -> dict[str, Any]:
    return {"what": "training images/s (median over timed windows), peak memory after the timed steps and "
                    "GPU busy fraction of profiled steps, detrkit beside the reference, each at its defaults",
            "device": args.device, "configs": configs, "smoke": args.smoke,
            "harness": {"window_images": args.window_images, "min_window_steps": args.min_window_steps,
                        "warmup_windows": args.warmup_windows, "timed_windows": args.windows,
                        "profile_steps": args.profile_steps, "resolution_override": args.resolution,
                        "train_kwargs": json.loads(args.train_kwargs)},
            "floor": {"nano_gflop_per_image": args.flops_per_image, "peak_tflops": args.peak_tflops},
            "runs": {}, "comparison": {}}


def launch(args: argparse.Namespace, package: str, variant: str, batch: int, dataset: Path, scratch: Path,
           log: Path, count_flops: bool) -> dict[str, Any]:
    """One `run` in a fresh interpreter; its output is appended to the log."""
    out = scratch / f"{package}-{variant}-{batch}.json"
    seconds = min(args.run_timeout, args.deadline - time.time())
    if seconds < 30:
        return {"skipped": f"{seconds:.0f} s left of --budget"}
    command = [getattr(args, f"{package}_python"), str(Path(__file__).resolve()), "run", "--package", package,
               "--variant", variant, "--batch-size", str(batch), "--dataset", str(dataset), "--json-out", str(out),
               "--device", args.device, "--train-kwargs", args.train_kwargs, "--launched-at", str(time.time())]
    command += [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in
                ("window_images", "min_window_steps", "warmup_windows", "windows", "profile_steps")]
    command += ["--resolution", str(args.resolution)] if args.resolution else []
    command += ["--count-flops"] if count_flops else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    path = getattr(args, f"{package}_pythonpath")
    if path is not None:
        env["PYTHONPATH"] = path
    started = time.perf_counter()
    with log.open("a") as stream:
        stream.write(f"\n===== {package} {variant}:{batch}\n")
        stream.flush()
        process = subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT, cwd=scratch)
        try:
            code: int | str = process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            code = "timeout"
            stop(process)
        except BaseException:  # the driver itself is stopped: take the run with it
            stop(process)
            raise
    run = json.loads(out.read_text()) if out.exists() else {}
    run.update(exit=code, process_s=time.perf_counter() - started)
    return run


def stop(process: subprocess.Popen) -> None:
    """SIGTERM first (the run then writes what it measured), SIGKILL if it does not end soon."""
    process.terminate()
    try:
        process.wait(timeout=8)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def compare(runs: dict[str, dict], variant: str, args: argparse.Namespace, all_runs: dict) -> dict[str, Any]:
    """detrkit/reference ratios of one configuration, and each package's fraction of the floor."""
    ours, theirs = runs.get("detrkit", {}), runs.get("reference", {})
    ratios = {key: ours[key] / theirs[key] for key in
              ("images_per_s", "peak_allocated_mib", "peak_reserved_mib", "busy_fraction")
              if ours.get(key) and theirs.get(key)}
    gflop = args.flops_per_image if variant == "nano" else measured_gflop(all_runs, variant)
    floor = {"gflop_per_image": gflop, "gflop_source": "--flops-per-image" if variant == "nano" else "measured",
             "measured_gflop_per_image": measured_gflop(all_runs, variant)}
    if gflop and args.device == "cuda":
        floor["floor_images_per_s"] = args.peak_tflops * 1e3 / gflop
        for package, run in runs.items():
            if run.get("images_per_s"):
                floor[f"{package}_fraction"] = run["images_per_s"] / floor["floor_images_per_s"]
    return {"detrkit_over_reference": ratios, "floor": floor}


def measured_gflop(all_runs: dict, variant: str) -> float | None:
    counts = [run["detrkit"]["measured_gflop_per_image"] for name, run in all_runs.items()
              if name.startswith(variant + ":") and "measured_gflop_per_image" in run.get("detrkit", {})]
    return counts[0] if counts else None


def brief(run: dict[str, Any]) -> str:
    if "skipped" in run:
        return f"skipped: {run['skipped']}"
    rate, peak = run.get("images_per_s"), run.get("peak_allocated_mib")
    return (f"{rate:.1f} img/s" if rate else "no rate") + (f", peak {peak:.0f} MiB" if peak else "") + \
        f", exit {run.get('exit')}" + (f" ({run['error']})" if "error" in run else "")


def table(result: dict[str, Any]) -> str:
    """The ratios table: one row per configuration."""
    head = (f"{'config':<11}{'detrkit img/s':>14}{'ref img/s':>11}{'ratio':>7}{'detrkit MiB':>13}{'ref MiB':>9}"
            f"{'ratio':>7}{'busy d/r':>11}{'floor d/r':>12}")
    rows = [head]
    for name, runs in result["runs"].items():
        ours, theirs = runs.get("detrkit", {}), runs.get("reference", {})
        comparison = result["comparison"].get(name, {})
        ratios, floor = comparison.get("detrkit_over_reference", {}), comparison.get("floor", {})
        rows.append(f"{name:<11}{_num(ours.get('images_per_s')):>14}{_num(theirs.get('images_per_s')):>11}"
                    f"{_num(ratios.get('images_per_s'), 2):>7}{_num(ours.get('peak_allocated_mib'), 0):>13}"
                    f"{_num(theirs.get('peak_allocated_mib'), 0):>9}{_num(ratios.get('peak_allocated_mib'), 2):>7}"
                    f"{_num(ours.get('busy_fraction'), 2) + '/' + _num(theirs.get('busy_fraction'), 2):>11}"
                    f"{_num(floor.get('detrkit_fraction'), 3) + '/' + _num(floor.get('reference_fraction'), 3):>12}")
    return "\n".join(rows)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> int:
    args = parse_args()
    if args.mode == "run":
        return run_one(args)
    if args.mode == "summary":
        print(table(json.loads(args.result.read_text())))
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
