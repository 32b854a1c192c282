#!/usr/bin/env python3
"""Wall time of OnePassCocoMeanAveragePrecision.compute() per backend, beside pycocotools.

    python benchmarks/coco_eval.py --threads 2 [--images 5000 --dets 300 --gts 75 --classes 80]
        [--masks --mask-size 64] [--backends vernier hotcoco ...] [--repeats 3] [--out result.json]

The state is the seed page's synthetic COCO-val shape: per image `--dets` random small boxes
(1-11 px) with uniform scores and `--gts` ground truths with a random area, on a 640 px image
and `--classes` classes. `--masks` adds a mask per box (its rectangle, drawn on a
`--mask-size` square canvas) and evaluates ("bbox", "segm"). Only compute() is timed: update()
copies tensors the same way for every backend. Each backend's numbers are checked for exact
equality with faster-coco-eval's and against pycocotools', whose row is evaluate() +
accumulate() on the same COCO objects (building them is reported apart). The thread count is
fixed for torch, OpenMP and Rayon before any evaluator loads, and reported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--dets", type=int, default=300, help="detections per image")
    parser.add_argument("--gts", type=int, default=75, help="ground truths per image")
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--image-size", type=float, default=640.0)
    parser.add_argument("--max-dets", type=int, default=500, help="last max-detections threshold")
    parser.add_argument("--masks", action="store_true", help="box+mask evaluation")
    parser.add_argument("--mask-size", type=int, default=64, help="mask canvas side with --masks")
    parser.add_argument("--backends", nargs="+", default=None, help="registry names; default all")
    parser.add_argument("--no-pycocotools", action="store_true", help="skip the pycocotools row")
    parser.add_argument("--repeats", type=int, default=1, help="timed compute() calls per backend")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    return parser.parse_args()


def pin_threads(threads: int) -> None:
    """Before torch or any evaluator is imported: one thread budget for every pool."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[name] = str(threads)


def synthetic_state(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    import torch

    torch.manual_seed(args.seed)

    def boxes(count: int) -> torch.Tensor:
        top_left = torch.rand(count, 2) * (args.image_size - 10)
        return torch.cat([top_left, top_left + torch.rand(count, 2) * 10 + 1], dim=1)  # xyxy

    preds, targets = [], []
    for _ in range(args.images):
        pred = {"boxes": boxes(args.dets), "scores": torch.rand(args.dets),
                "labels": torch.randint(0, args.classes, (args.dets,))}
        target = {"boxes": boxes(args.gts), "labels": torch.randint(0, args.classes, (args.gts,)),
                  "iscrowd": torch.zeros(args.gts, dtype=torch.long), "area": torch.rand(args.gts) * 1000}
        if args.masks:
            pred["masks"] = rectangles(pred["boxes"], args.image_size, args.mask_size)
            target["masks"] = rectangles(target["boxes"], args.image_size, args.mask_size)
        preds.append(pred)
        targets.append(target)
    return preds, targets


def rectangles(boxes, image_size: float, side: int):
    """(N, side, side) masks of the boxes, scaled from the image onto the canvas."""
    import torch

    scaled = boxes * (side / image_size)
    centres = torch.arange(side) + 0.5
    columns = (centres >= scaled[:, 0, None]) & (centres <= scaled[:, 2, None] + 1)  # (N, side)
    rows = (centres >= scaled[:, 1, None]) & (centres <= scaled[:, 3, None] + 1)
    return rows[:, :, None] & columns[:, None, :]


def time_backend(name: str, preds: list, targets: list, args: argparse.Namespace) -> tuple[list[float], dict]:
    from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision

    iou_type = ("bbox", "segm") if args.masks else "bbox"
    metric = OnePassCocoMeanAveragePrecision(
        iou_type=iou_type, backend=name, class_metrics=True, sync_on_compute=False,
        max_detection_thresholds=[1, 10, args.max_dets],
    )
    for start in range(0, len(preds), 32):
        metric.update(preds[start : start + 32], targets[start : start + 32])
    times, result = [], {}
    for _ in range(args.repeats):
        metric._computed = None  # torchmetrics caches compute()
        gc.collect()
        start = time.perf_counter()
        result = metric.compute()
        times.append(time.perf_counter() - start)
    return times, result


def time_pycocotools(preds: list, targets: list, args: argparse.Namespace) -> dict:
    """COCOeval.evaluate() + accumulate() per IoU type; precision arrays kept for the parity check."""
    import numpy as np
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(boxes):
        boxes = boxes.double().numpy()
        return np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)

    rows = {}
    for iou_type in ("bbox", "segm") if args.masks else ("bbox",):
        start = time.perf_counter()
        images, annotations, results = [], [], []
        for image_id, (pred, target) in enumerate(zip(preds, targets), start=1):
            images.append({"id": image_id, "height": args.mask_size, "width": args.mask_size})
            gt_masks = mask_utils.encode(np.asfortranarray(target["masks"].permute(1, 2, 0).numpy().astype(np.uint8))) if iou_type == "segm" else None
            dt_masks = mask_utils.encode(np.asfortranarray(pred["masks"].permute(1, 2, 0).numpy().astype(np.uint8))) if iou_type == "segm" else None
            for k, (box, label, area) in enumerate(zip(xywh(target["boxes"]).tolist(), target["labels"].tolist(), target["area"].double().tolist())):
                annotation = {"id": len(annotations) + 1, "image_id": image_id, "category_id": label, "bbox": box, "area": area, "iscrowd": 0}
                if gt_masks is not None:
                    annotation["segmentation"] = gt_masks[k]
                annotations.append(annotation)
            for k, (box, label, score) in enumerate(zip(xywh(pred["boxes"]).tolist(), pred["labels"].tolist(), pred["scores"].double().tolist())):
                result = {"image_id": image_id, "category_id": label, "score": score}
                result["segmentation" if dt_masks is not None else "bbox"] = dt_masks[k] if dt_masks is not None else box
                results.append(result)
        classes = sorted({label for item in preds + targets for label in item["labels"].tolist()})
        with contextlib.redirect_stdout(io.StringIO()):
            ground_truth = COCO()
            ground_truth.dataset = {"images": images, "annotations": annotations, "categories": [{"id": c} for c in classes]}
            ground_truth.createIndex()
            evaluator = COCOeval(ground_truth, ground_truth.loadRes(results), iou_type)
            evaluator.params.maxDets = [1, 10, args.max_dets]
            built = time.perf_counter()
            evaluator.evaluate()
            evaluator.accumulate()
        finished = time.perf_counter()
        precision = evaluator.eval["precision"][:, :, :, 0, -1]
        rows[iou_type] = {"build_s": built - start, "evaluate_accumulate_s": finished - built,
                          "map": float(np.mean(precision[precision > -1])) if (precision > -1).any() else -1.0}
        del evaluator, ground_truth, images, annotations, results
        gc.collect()
    return rows


def main() -> None:
    args = parse_args()
    pin_threads(args.threads)
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    torch.set_num_threads(args.threads)
    from detrkit.training.coco_map import _BACKENDS

    backends = args.backends or list(_BACKENDS)
    baseline = "faster_coco_eval"
    if baseline not in backends:
        backends.append(baseline)
    preds, targets = synthetic_state(args)
    rows, results = {}, {}
    for name in backends:
        times, results[name] = time_backend(name, preds, targets, args)
        rows[name] = {"compute_s": statistics.median(times), "runs_s": times}
        print(f"{name:>18}: compute() {rows[name]['compute_s']:.2f} s", file=sys.stderr, flush=True)
    for name, result in results.items():
        rows[name]["identical_to_faster_coco_eval"] = all(torch.equal(result[key], results[baseline][key]) for key in result)
    if not args.no_pycocotools:
        reference = time_pycocotools(preds, targets, args)
        prefix = {iou_type: (f"{iou_type}_" if args.masks else "") for iou_type in reference}
        for name, result in results.items():
            rows[name]["max_map_difference_to_pycocotools"] = max(
                abs(result[prefix[iou_type] + "map"].item() - row["map"]) for iou_type, row in reference.items())
        total = sum(row["evaluate_accumulate_s"] for row in reference.values())
        rows["pycocotools"] = {"evaluate_accumulate_s": total, "build_s": sum(row["build_s"] for row in reference.values())}
        for name in backends:
            rows[name]["speedup_vs_pycocotools"] = total / rows[name]["compute_s"]
    report = {
        "state": {key: getattr(args, key) for key in ("images", "dets", "gts", "classes", "image_size", "max_dets", "masks", "mask_size", "seed")},
        "iou_type": "bbox+segm" if args.masks else "bbox",
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "rows": rows,
    }
    print_table(report)
    print(json.dumps(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


def print_table(report: dict) -> None:
    print(f"{report['iou_type']}, {report['state']['images']} images x {report['state']['dets']} detections, "
          f"{report['threads']} threads", file=sys.stderr)
    print(f"{'backend':>18} {'compute() s':>12} {'x pycocotools':>14} {'identical':>10}", file=sys.stderr)
    for name, row in report["rows"].items():
        if name == "pycocotools":
            print(f"{name:>18} {row['evaluate_accumulate_s']:>12.2f} {'1.0':>14} {'oracle':>10}   "
                  f"(evaluate+accumulate; building COCO objects {row['build_s']:.1f} s more)", file=sys.stderr)
        else:
            speedup = row.get("speedup_vs_pycocotools", float("nan"))
            print(f"{name:>18} {row['compute_s']:>12.2f} {speedup:>14.1f} {str(row['identical_to_faster_coco_eval']):>10}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
