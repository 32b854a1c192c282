"""The accuracy check of an export: the exported file and the PyTorch model on the same images, compared and judged."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torchvision.ops import box_iou

from detrkit.datasets.images import ImageInput, to_tensor
from detrkit.models.deploy_graph import to_pixel_results
from detrkit.models.postprocess import select_detections_batched
from detrkit.structures import DetectorOutput

FALLBACK_TOP = 10  # detections per image compared when too few score above the threshold
MATCH_IOU = 0.9


class ExportAccuracyError(RuntimeError):
    """An export whose outputs differ from the PyTorch model's beyond the check's tolerances."""


@dataclass
class CheckReport:
    """What `check_export` measured. `selection` says which PyTorch detections were compared:
    those above `threshold`, or each image's top FALLBACK_TOP when fewer than that scored above
    it over the whole set (an untrained model), so the check never compares nothing."""

    images: int
    max_abs_diff: dict[str, float]
    compared: int
    matched: int
    threshold: float
    selection: str
    min_matched: float
    map_tolerance: float
    map_pytorch: float | None = None
    map_exported: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def matched_fraction(self) -> float:
        return self.matched / self.compared if self.compared else 1.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def table(self) -> str:
        rows = [("images", str(self.images))]
        rows += [(f"max |diff| {name}", f"{value:.3g}") for name, value in self.max_abs_diff.items()]
        rows.append((f"matched (IoU >= {MATCH_IOU}, same class)",
                     f"{self.matched}/{self.compared} = {self.matched_fraction:.2%} ({self.selection})"))
        if self.map_pytorch is not None:
            drop = 100 * (self.map_pytorch - self.map_exported)
            rows.append(("mAP@50:95 pytorch / exported", f"{self.map_pytorch:.4f} / {self.map_exported:.4f} "
                                                         f"(drop {drop:+.2f} points)"))
        rows.append(("result", "passed" if self.passed else "FAILED: " + "; ".join(self.failures)))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def write(self, path: Path) -> Path:
        data = asdict(self) | {"matched_fraction": self.matched_fraction, "passed": self.passed}
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path


def check_export(pytorch, exported, images: Sequence[ImageInput], threshold: float = 0.5,
                 min_matched: float = 0.99, map_tolerance: float = 0.5, ground_truth: Sequence[dict] | None = None,
                 num_classes: int | None = None, raw: bool = False, batch: int = 1) -> CheckReport:
    """Run `images` through both predictors' graphs (`_run_graph` of an RFDETR and of an
    ExportedModel, the same pre-processing) and compare.

    Fails when the matched fraction of the PyTorch detections is below `min_matched`, or, with
    `ground_truth` (per image {"boxes" xyxy source pixels, "labels", optional "iscrowd"}), when
    the exported model's box mAP@50:95 is more than `map_tolerance` points below the PyTorch one.
    `raw` exports are post-processed here the same way on both sides before matching.
    """
    tensors = [to_tensor(image, pytorch._channels) for image in images]
    preparer = pytorch._preparer(None)
    diffs: dict[str, float] = {}
    pairs: list[tuple[dict, dict]] = []
    for start in range(0, len(tensors), batch):
        chunk = tensors[start:start + batch]
        sizes = torch.tensor([t.shape[-2:] for t in chunk])
        pixels = preparer(chunk)
        with torch.inference_mode():
            ours, theirs = pytorch._run_graph(pixels, raw), exported._run_graph(pixels, raw)
        for name, value in ours.items():
            if name == "labels":  # compared by the matching below
                continue
            diffs[name] = max(diffs.get(name, 0.0), _max_abs_diff(value.cpu(), theirs[name].cpu()))
        if raw:
            ours, theirs = (_post_process(o, pytorch) for o in (ours, theirs))
        pairs += zip(to_pixel_results({k: v.cpu() for k, v in ours.items()}, sizes),
                     to_pixel_results({k: v.cpu() for k, v in theirs.items()}, sizes))
    above = sum(int((mine["scores"] > threshold).sum()) for mine, _ in pairs)
    fallback = above < FALLBACK_TOP
    selection = f"top {FALLBACK_TOP} per image, {above} above {threshold}" if fallback else f"score > {threshold}"
    compared = matched = 0
    for mine, other in pairs:
        keep = slice(0, FALLBACK_TOP) if fallback else mine["scores"] > threshold
        count, hits = _match(mine["boxes"][keep], mine["labels"][keep], other["boxes"], other["labels"])
        compared, matched = compared + count, matched + hits
    report = CheckReport(len(tensors), diffs, compared, matched, threshold, selection, min_matched, map_tolerance)
    if report.matched_fraction < min_matched:
        report.failures.append(f"matched {report.matched_fraction:.2%} < {min_matched:.0%}")
    if ground_truth is not None:
        report.map_pytorch, report.map_exported = (
            _box_map([side[i] for side in pairs], ground_truth, num_classes) for i in (0, 1))
        if 100 * (report.map_pytorch - report.map_exported) > map_tolerance:
            report.failures.append(f"mAP dropped more than {map_tolerance} points")
    return report


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b|, NaN equal to NaN (unused keypoint slots); inf where shapes or NaNs differ."""
    if a.shape != b.shape:
        return math.inf
    a, b = a.double(), b.double()
    if not torch.equal(a.isnan(), b.isnan()):
        return math.inf
    both = ~a.isnan()
    return float((a[both] - b[both]).abs().nan_to_num(nan=math.inf).max()) if both.any() else 0.0


def _post_process(raw: dict[str, torch.Tensor], pytorch) -> dict[str, torch.Tensor]:
    """A raw export's heads as the post-processed outputs (normalised), by the config's settings."""
    config = pytorch.model_config
    outputs = DetectorOutput(raw["pred_logits"], raw["pred_boxes"], pred_masks=raw.get("pred_masks"),
                             pred_keypoints=raw.get("pred_keypoints"))
    unit = torch.ones(len(raw["pred_logits"]), 2)
    return select_detections_batched(outputs, unit, config.num_select, config.num_keypoints_per_class,
                                     config.postprocess_trace_alpha)


def _match(boxes: torch.Tensor, labels: torch.Tensor, other_boxes: torch.Tensor,
           other_labels: torch.Tensor) -> tuple[int, int]:
    """(compared, matched): each of `boxes` in order takes the unused same-class box of the other
    side with the highest IoU, a match when that IoU is at least MATCH_IOU."""
    if len(boxes) == 0:
        return 0, 0
    iou = box_iou(boxes.double(), other_boxes.double())  # (N, M)
    iou[labels[:, None] != other_labels[None, :]] = -1
    used = torch.zeros(len(other_boxes), dtype=torch.bool)
    hits = 0
    for row in iou:
        row = row.masked_fill(used, -1)
        best = int(row.argmax()) if len(row) else -1
        if best >= 0 and row[best] >= MATCH_IOU:
            used[best] = True
            hits += 1
    return len(boxes), hits


def _box_map(detections: Sequence[dict], ground_truth: Sequence[dict], num_classes: int | None) -> float:
    from detrkit.training.coco_map import OnePassCocoMeanAveragePrecision

    # the background logit's label (num_classes) has no ground truth: its AP is -1, outside the mean
    metric = OnePassCocoMeanAveragePrecision(num_classes=None if num_classes is None else num_classes + 1)
    metric.update([{k: d[k] for k in ("boxes", "scores", "labels")} for d in detections], list(ground_truth))
    return float(metric.compute()["map"])
