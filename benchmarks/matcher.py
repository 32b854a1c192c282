#!/usr/bin/env python3
"""Median time of one training step's Hungarian matching, for each assignment solver.

    python benchmarks/matcher.py [--device cuda] [--batches 4 64] [--layers 3 7] [--repeats 7]
        [--solvers scipy torch_linear_assignment] [--out result.json]

A step's shapes: 13 query groups x 300 queries in every output layer (decoder layers and encoder
proposals), 1-20 targets per image, 91 classes. Each case times `HungarianMatcher.match_layers`
(costs on the device, assignment, indices back on the device; `step_ms`) and the solver alone on
the same costs (`solve_ms`), medians over the repeats after one untimed call (`first_ms`, which
includes Triton's compilation for torch_linear_assignment). By default only SciPy runs on the CPU
(torch_linear_assignment would fall back to SciPy there); on CUDA also torch_linear_assignment
when it is installed. The solvers' totals are checked to agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from detrkit.losses.matcher import SOLVERS, HungarianMatcher
from detrkit.structures import Target

GROUPS, QUERIES_PER_GROUP, CLASSES, MAX_TARGETS = 13, 300, 91, 20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 7], help="output layers matched per step")
    parser.add_argument("--solvers", nargs="+", choices=sorted(SOLVERS),
                        help="default: scipy, and torch_linear_assignment on CUDA when installed")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON result here")
    return parser.parse_args()


def step_inputs(batch: int, layers: int, device: torch.device, generator: torch.Generator):
    """Random (logits, boxes) for each output layer and targets of 1-20 boxes per image."""
    queries = GROUPS * QUERIES_PER_GROUP
    outputs = [(torch.randn(batch, queries, CLASSES, generator=generator).to(device),
                (torch.rand(batch, queries, 4, generator=generator) * 0.5 + 0.25).to(device)) for _ in range(layers)]
    sizes = torch.randint(1, MAX_TARGETS + 1, (batch,), generator=generator).tolist()
    targets = [Target((torch.rand(n, 4, generator=generator) * 0.5 + 0.25).to(device),
                      torch.randint(0, CLASSES, (n,), generator=generator).to(device), i, (640, 640), (640, 640))
               for i, n in enumerate(sizes)]
    return outputs, targets, sizes


def timed(call: Callable[[], object], repeats: int, device: torch.device) -> tuple[float, float]:
    """(first call, median of `repeats` calls) in milliseconds, the device drained around each."""
    times = []
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times[0], statistics.median(times[1:])


def total_cost(costs: list[torch.Tensor], matches) -> float:
    """Σ over layers of the matched pairs' costs (query index folded back into the layer's Q)."""
    return sum(cost[m.query % cost.shape[0], m.target].double().sum().item() for cost, m in zip(costs, matches))


def run_case(batch: int, layers: int, solvers: list[str], repeats: int, device: torch.device, seed: int) -> list[dict]:
    outputs, targets, sizes = step_inputs(batch, layers, device, torch.Generator().manual_seed(seed))
    reference = HungarianMatcher()
    labels, boxes = torch.cat([t.labels for t in targets]), torch.cat([t.boxes for t in targets])
    image = torch.cat([t.labels.new_full(t.labels.shape, i) for i, t in enumerate(targets)])
    costs = [reference.cost_matrix(logits, pred, labels, boxes, image) for logits, pred in outputs]
    rows, totals = [], {}
    for name in solvers:
        matcher = HungarianMatcher(solver=name)
        first, step = timed(lambda: matcher.match_layers(outputs, targets, GROUPS), repeats, device)
        _, solve = timed(lambda: matcher.solve(costs, sizes, GROUPS), repeats, device)
        totals[name] = total_cost(costs, matcher.solve(costs, sizes, GROUPS))
        rows.append({"solver": name, "batch": batch, "layers": layers, "targets": sum(sizes),
                     "problems": batch * GROUPS * layers, "first_ms": round(first, 3), "step_ms": round(step, 3),
                     "solve_ms": round(solve, 3), "total_cost": totals[name]})
    if len(totals) > 1 and max(totals.values()) - min(totals.values()) > 1e-3 * abs(min(totals.values())):
        raise SystemExit(f"solvers disagree on the optimum: {totals}")
    return rows


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    solvers = args.solvers or ["scipy"] + (["torch_linear_assignment"] if device.type == "cuda"
                                           and "torch_linear_assignment" in SOLVERS else [])
    cases = [row for batch in args.batches for layers in args.layers
             for row in run_case(batch, layers, solvers, args.repeats, device, args.seed)]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "groups": GROUPS, "queries_per_group": QUERIES_PER_GROUP, "repeats": args.repeats, "cases": cases}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as stream:
            stream.write(text + "\n")


if __name__ == "__main__":
    main()
