"""Soak: short tiny trainings killed (SIGKILL) or interrupted (SIGINT, Ctrl-C) at random moments
and resumed; each must end with the weights of an uninterrupted run, bit for bit.

    python benchmarks/soak.py --runs 20 --kills 2 --epochs 4 --seed 0 [--signal kill|int|mixed]
        [--out benchmarks/results/soak_cpu.json]

A SIGKILL leaves last.ckpt at the last completed epoch; a SIGINT lets the step finish and writes
last.ckpt there (`interrupted_at` in it), so its resume goes on in the middle of the epoch.

An uninterrupted run is timed first (after a warm-up run): its child reports when training
starts and ends, so the time of one step (with its share of validation and checkpoint writes) is
known. Each kill draws a random step of the run and a random delay up to that step time; it waits
for its child to report beginning that step, then kills it after the delay. So kills land in
training steps, validation or checkpoint writes (never in imports), and a machine slowed by other
work moves them only within the training. Each run starts the training,
kills it, and starts it again with resume="last" (or from scratch when no epoch had completed);
the last of its `--kills` restarts is left to finish. The final last.ckpt (live weights, EMA weights, Adam moments, step) is compared
with the uninterrupted run's. The JSON lists every run: kill times, the epoch last.ckpt held at
each kill, partial files left behind, and whether the end state was identical.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS_PER_EPOCH = 5  # 6 training images, batch 2: the tiny-set minimum of 5 optimizer steps
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_config.TINY: the tests' tiny model


def child(data: str, output: str, epochs: int, resume: bool, timing: str) -> None:
    """One training process: a tiny Nano, seeded, writing its training window to `timing`."""
    import warnings

    import pytorch_lightning as pl
    import torch
    from tiny_config import TINY

    from detrkit import RFDETRNano

    warnings.filterwarnings("ignore")

    class Window(pl.Callback):
        def on_train_start(self, trainer, module):
            Path(timing).write_text(json.dumps({"train_start": time.time()}))

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            beat = Path(f"{timing}.step.tmp")
            beat.write_text(str(trainer.global_step))
            os.replace(beat, f"{timing}.step")  # the parent never reads half a number

        def on_train_end(self, trainer, module):
            stamps = json.loads(Path(timing).read_text())
            Path(timing).write_text(json.dumps({**stamps, "train_end": time.time()}))

    torch.manual_seed(0)
    RFDETRNano(**TINY).train(dataset_dir=data, output_dir=output, epochs=epochs, checkpoint_interval=1,
                             batch_size=2, num_workers=0, progress_bar=None, tensorboard=False, seed=0,
                             resume="last" if resume else None, callbacks=[Window()])


def launch(data: Path, output: Path, epochs: int, resume: bool, timing: Path) -> subprocess.Popen:
    command = [sys.executable, __file__, "--child", str(data), str(output), str(epochs), str(int(resume)), str(timing)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def timed_run(data: Path, output: Path, epochs: int, resume: bool) -> dict:
    """An uninterrupted (possibly resumed) run: its wall time and training window, from its start."""
    timing = output.parent / f"{output.name}.timing.json"
    started = time.time()
    process = launch(data, output, epochs, resume, timing)
    _, errors = process.communicate(timeout=1800)
    if process.returncode != 0:
        raise RuntimeError(f"training failed: {errors[-3000:]}")
    stamps = json.loads(timing.read_text()) if timing.is_file() else {}
    # a resume of a run that had finished all its epochs trains nothing: no window
    window = (stamps["train_start"] - started, stamps["train_end"] - started) if "train_end" in stamps else None
    timing.unlink(missing_ok=True)
    return {"wall_s": time.time() - started, "window_s": window}


def kill_at(data: Path, output: Path, epochs: int, resume: bool, step: int, delay: float,
            how: str = "kill") -> dict:
    """Start a run and SIGKILL it (`how="kill"`) or send it SIGINT (`"int"`, then wait for it to
    stop) `delay` seconds after it began training step `step` (its child reports each step it
    begins; a resumed run past `step` is stopped `delay` after its first step); what it left."""
    timing = output.parent / f"{output.name}.timing.json"
    beat = Path(f"{timing}.step")
    timing.unlink(missing_ok=True)
    beat.unlink(missing_ok=True)
    started = time.time()
    process = launch(data, output, epochs, resume, timing)
    while process.poll() is None and not (beat.is_file() and int(beat.read_text() or -1) >= step):
        time.sleep(0.002)
    try:
        process.wait(timeout=delay)
        finished = True  # it ended before the kill (a resume with nothing left to train)
    except subprocess.TimeoutExpired:
        kill_time = time.time()
        if how == "int":
            process.send_signal(signal.SIGINT)
            process.wait(timeout=600)
        else:
            process.kill()
            process.wait()
        finished = False
    last = output / "last.ckpt"
    held = _held(last) if last.is_file() else {}
    return {"signal": how, "step": step, "delay_s": round(delay, 4),
            "kill_at_s": round((kill_time if not finished else time.time()) - started, 3),
            "finished_before_kill": finished, "last_ckpt_epoch": held.get("epoch"),
            "last_ckpt_interrupted_at": held.get("interrupted_at"),
            "partial_files": sorted(p.name for p in output.glob(".*.tmp"))}


def _held(path: Path) -> dict:
    """The epoch a last.ckpt holds, and where a Ctrl-C wrote it (None for an epoch's end)."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return {"epoch": int(checkpoint["epoch"]), "interrupted_at": checkpoint.get("interrupted_at")}


def same_state(a: Path, b: Path) -> dict:
    """Compare two last.ckpt files: live and EMA weights, Adam moments, epoch and step."""
    import torch

    first, second = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    weights = all(torch.equal(v, second["state_dict"][k]) for k, v in first["state_dict"].items())
    ema = all(torch.equal(v, second["callbacks"]["EMA"]["weights"][k])
              for k, v in first["callbacks"]["EMA"]["weights"].items())
    moments = all(torch.equal(state[name], second["optimizer_states"][0]["state"][index][name])
                  for index, state in first["optimizer_states"][0]["state"].items() for name in ("exp_avg", "exp_avg_sq"))
    steps = (first["epoch"], first["global_step"]) == (second["epoch"], second["global_step"])
    return {"weights": weights, "ema": ema, "moments": moments, "epoch_and_step": steps,
            "identical": weights and ema and moments and steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=1, help="kills per run, each followed by a resume")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signal", choices=["kill", "int", "mixed"], default="kill",
                        help="SIGKILL, SIGINT (Ctrl-C) or a random one of the two for each stop")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting runs after this many seconds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from detrkit.datasets.synthetic import make_synthetic_dataset

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="detrkit-soak-"))
    began = time.time()
    try:
        data = make_synthetic_dataset(work / "shapes", num_train=6, num_valid=2, num_test=0, image_size=(96, 64),
                                      seed=0)
        timed_run(data, work / "warm_up", args.epochs, resume=False)  # file caches warm: the window as runs see it
        reference = work / "reference"
        timing = timed_run(data, reference, args.epochs, resume=False)
        window = timing["window_s"]
        steps = args.epochs * STEPS_PER_EPOCH
        per_step = (window[1] - window[0]) / steps
        print(f"uninterrupted: {timing['wall_s']:.1f} s, training from {window[0]:.1f} s to {window[1]:.1f} s",
              flush=True)
        runs = []
        for index in range(args.runs):
            if args.budget_s is not None and time.time() - began > args.budget_s:
                break
            output = work / f"run{index}"
            kills = []
            resume = False
            for _ in range(args.kills):
                # a random step, then a random moment of the time one step (with its share of the
                # epoch's validation and checkpoint writes) takes
                step = rng.randrange(steps)
                how = rng.choice(["kill", "int"]) if args.signal == "mixed" else args.signal
                kills.append(kill_at(data, output, args.epochs, resume, step, rng.uniform(0, per_step), how))
                resume = (output / "last.ckpt").is_file()
            resumed = timed_run(data, output, args.epochs, resume=resume)
            comparison = same_state(reference / "last.ckpt", output / "last.ckpt")
            runs.append({"run": index, "kills": kills, "resumed_from_checkpoint": resume,
                         "resume_wall_s": round(resumed["wall_s"], 2),
                         "partial_files_after_resume": sorted(p.name for p in output.glob(".*.tmp")), **comparison})
            print(f"run {index}: kill at {kills[-1]['kill_at_s']:.2f} s (last.ckpt epoch "
                  f"{kills[-1]['last_ckpt_epoch']}), identical={comparison['identical']}", flush=True)
            shutil.rmtree(output)
        result = {
            "benchmark": "soak", "device": "cpu", "epochs": args.epochs, "kills_per_run": args.kills,
            "signal": args.signal,
            "seed": args.seed, "uninterrupted_wall_s": round(timing["wall_s"], 2),
            "training_window_s": [round(t, 2) for t in window], "step_time_s": round(per_step, 4),
            "runs_done": len(runs),
            "runs_identical": sum(r["identical"] for r in runs),
            "killed_mid_training": sum(not k["finished_before_kill"] for r in runs for k in r["kills"]),
            "sigint_mid_epoch_checkpoints": sum(bool(k.get("last_ckpt_interrupted_at")) for r in runs
                                                for k in r["kills"]),
            "partial_files_seen": sum(bool(k["partial_files"]) for r in runs for k in r["kills"]),
            "total_wall_s": round(time.time() - began, 1), "runs": runs,
        }
        text = json.dumps(result, indent=2)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        data, output, epochs, resume, timing = sys.argv[2:7]
        child(data, output, int(epochs), resume == "1", timing)
    else:
        main()
