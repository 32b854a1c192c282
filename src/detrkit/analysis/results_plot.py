"""results.png: a run's losses and validation metrics by epoch, drawn from its metrics.csv."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

# validation metrics drawn when logged, with their titles; the EMA twin (val/ema_*) is drawn beside each
METRICS = (("mAP_50_95", "mAP 50:95"), ("mAP_50", "mAP 50"), ("mAR", "mAR"), ("F1", "F1"),
           ("segm_mAP_50_95", "mask mAP 50:95"), ("keypoint_map_50_95", "keypoint AP 50:95"))
_LAYER_TERM = re.compile(r"_(aux|enc|\d+)(_epoch)?$")  # per-layer and summed auxiliary terms are left out
COLUMNS = 4


def read_epochs(metrics_csv: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Column -> [(1-based epoch, value)] for every non-empty cell of metrics.csv."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(metrics_csv, newline="") as stream:
        for row in csv.DictReader(stream):
            if not row.get("epoch", "").isdigit():
                continue
            for key, value in row.items():
                if key not in ("epoch", "step") and value not in ("", None):
                    series.setdefault(key, []).append((int(row["epoch"]) + 1, float(value)))
    return series


def panels(series: dict[str, list[tuple[int, float]]]) -> list[tuple[str, dict[str, str]]]:
    """(title, {column: legend}) of each plot: the total loss, each loss term, each validation metric."""
    chosen: list[tuple[str, dict[str, str]]] = []
    total = {key: label for key, label in (("train/loss", "train"), ("train/loss_epoch", "train"),
                                           ("val/loss", "val")) if key in series}
    if total:
        chosen.append(("loss", total))
    for key in sorted(series):
        name = key.removeprefix("train/").removesuffix("_epoch")
        if key.startswith("train/loss_") and not _LAYER_TERM.search(key) and name != "loss":
            chosen.append((name, {key: "train"}))
    for name, title in METRICS:
        lines = {key: label for key, label in ((f"val/{name}", "val"), (f"val/ema_{name}", "val EMA"))
                 if key in series}
        if len(lines) == 2 and series[f"val/{name}"] == series[f"val/ema_{name}"]:  # only the EMA was scored
            lines = {f"val/ema_{name}": "val (EMA weights)"}
        if lines:
            chosen.append((title, lines))
    return chosen


def plot_results(metrics_csv: str | Path, output: str | Path) -> Path | None:
    """Draw results.png at `output` from `metrics_csv`; None (nothing written) when it holds no epoch."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    series = read_epochs(metrics_csv)
    chosen = panels(series)
    if not chosen:
        return None
    rows = math.ceil(len(chosen) / COLUMNS)
    figure, axes = plt.subplots(rows, COLUMNS, figsize=(3.2 * COLUMNS, 2.6 * rows), squeeze=False)
    for axis, (title, lines) in zip(axes.flat, chosen):
        for key, label in lines.items():
            epochs, values = zip(*series[key])
            axis.plot(epochs, values, marker="o", markersize=3, linestyle="--" if "EMA" in label else "-",
                      label=label)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("epoch", fontsize=8)
        axis.tick_params(labelsize=8)
        axis.xaxis.get_major_locator().set_params(integer=True)
        axis.grid(alpha=0.3)
        if len(lines) > 1:
            axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(chosen):]:
        axis.set_visible(False)
    figure.tight_layout()
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
