#!/usr/bin/env python3
"""Collect task_learning.py runs into one results file and tabulate arms against a baseline, paired by seed.

    python benchmarks/learning_table.py add RESULTS.json LABEL RUN.json [RUN.json ...] [--side detrkit]
    python benchmarks/learning_table.py summarise RESULTS.json --baseline LABEL [--epochs 6 10] [--last 3]

RESULTS.json holds `curves`: arm label -> seed -> metric -> values by epoch. `add` files one side of
task_learning.py outputs under a label (a seed already there is replaced). `summarise` rewrites the
file's `summary` (per arm: the mean of each metric at the chosen epochs and averaged over the last
`--last` epochs, and baseline - arm as [mean, SE] over the seeds both have) and prints it as a
Markdown table. Averaging the last epochs damps the epoch-to-epoch swing of a small validation set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from task_learning import mean_and_se


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"curves": {}}


def add(results: Path, label: str, runs: list[Path], side: str) -> None:
    """File `side`'s curves of every seed in `runs` under `label`."""
    data = load(results)
    arm = data.setdefault("curves", {}).setdefault(label, {})
    for path in runs:
        for run in json.loads(path.read_text())["runs"]:
            if side not in run:
                raise SystemExit(f"{path}: seed {run['seed']} has no {side!r} side (it has {sorted(run)})")
            arm[str(run["seed"])] = {name: values for name, values in run[side].items() if name != "seconds"}
    results.write_text(json.dumps(data, indent=1) + "\n")


def statistic(values: list[float], epoch: int | None, last: int) -> float:
    """The value at 1-based `epoch`, or with None the mean of the last `last` epochs."""
    return values[epoch - 1] if epoch is not None else statistics.mean(values[-last:])


def paired(baseline: dict, arm: dict, metric: str, epoch: int | None, last: int) -> list[float] | None:
    """[mean, SE] of baseline - arm over the seeds both hold (SE None for one seed); None if none."""
    seeds = sorted(set(baseline) & set(arm), key=int)
    diffs = [statistic(baseline[s][metric], epoch, last) - statistic(arm[s][metric], epoch, last) for s in seeds]
    if not diffs:
        return None
    mean, se = mean_and_se(diffs)
    return [round(mean, 4), None if se is None else round(se, 4)]


def summarise(results: Path, baseline_label: str, epochs: list[int], last: int) -> dict:
    data = load(results)
    curves = data["curves"]
    if baseline_label not in curves:
        raise SystemExit(f"no arm {baseline_label!r} in {results}; arms: {sorted(curves)}")
    baseline = curves[baseline_label]
    points = [(f"e{epoch}", epoch) for epoch in epochs] + [(f"last{last}", None)]
    summary = {}
    for label, arm in curves.items():
        metrics = sorted(set.intersection(*(set(run) for run in arm.values())))
        row: dict = {"seeds": sorted(map(int, arm))}
        for metric in metrics:
            for name, epoch in points:
                row[f"{metric}@{name}_mean"] = round(statistics.mean(
                    statistic(run[metric], epoch, last) for run in arm.values()), 4)
                if label != baseline_label and all(metric in run for run in baseline.values()):
                    row[f"{metric}@{name}_baseline_minus_this"] = paired(baseline, arm, metric, epoch, last)
        summary[label] = row
    data["baseline"], data["summary"] = baseline_label, summary
    results.write_text(json.dumps(data, indent=1) + "\n")
    return summary


def table(summary: dict, metric: str, points: list[str]) -> str:
    head = f"| arm | seeds | {' | '.join(f'{metric} {p}' for p in points)} | baseline - arm ({', '.join(points)}) |"
    lines = [head, "|" + "---|" * (3 + len(points))]
    for label, row in summary.items():
        means = " | ".join(f"{row.get(f'{metric}@{p}_mean', float('nan')):.3f}" for p in points)
        diffs = [row.get(f"{metric}@{p}_baseline_minus_this") for p in points]
        shown = ", ".join("" if d is None else f"{d[0]:+.3f}" + ("" if d[1] is None else f" ± {d[1]:.3f}")
                          for d in diffs) if any(diffs) else ""
        seeds = row["seeds"]
        span = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))
        lines.append(f"| {label} | {span} | {means} | {shown} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add")
    adding.add_argument("results", type=Path)
    adding.add_argument("label")
    adding.add_argument("runs", type=Path, nargs="+")
    adding.add_argument("--side", choices=["detrkit", "rfdetr"], default="detrkit")
    summing = commands.add_parser("summarise")
    summing.add_argument("results", type=Path)
    summing.add_argument("--baseline", required=True)
    summing.add_argument("--epochs", type=int, nargs="*", default=[6, 10])
    summing.add_argument("--last", type=int, default=3)
    summing.add_argument("--metric", action="append", help="metric(s) to print (default mAP_50_95, mAP_50)")
    args = parser.parse_args()
    if args.command == "add":
        add(args.results, args.label, args.runs, args.side)
        return 0
    summary = summarise(args.results, args.baseline, args.epochs, args.last)
    points = [f"e{epoch}" for epoch in args.epochs] + [f"last{args.last}"]
    for metric in args.metric or ["mAP_50_95", "mAP_50"]:
        print(table(summary, metric, points), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
