"""The faster-coco-eval backend: pycocotools' object model with evaluate/accumulate in C++."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from detrkit.training.coco_backends.base import CocoInputs
from detrkit.training.coco_backends.cocoapi import PackageCocoBackend, coco_dataset, compressed_rles


class FasterCocoEvalBackend(PackageCocoBackend):
    package = "faster_coco_eval"
    distribution = "faster-coco-eval"

    def _package(self) -> tuple[type, type, ModuleType]:
        package = self.module
        return package.COCO, package.COCOeval_faster, package.mask

    def _ground_truth(self, inputs: CocoInputs) -> Any:
        coco, _, mask = self._package()
        dataset = coco_dataset(inputs, compressed_rles(mask, inputs.gt_rles, inputs.gt_sizes()))
        return coco(dataset, print_function=_silent)  # loadRes reports through it too

    def _evaluator(self, coco_eval: type, gt: Any, dt: Any, iou_type: str) -> Any:
        return coco_eval(gt, dt, iou_type, print_function=_silent)


def _silent(*_: object) -> None:
    """The packages report each stage; the metric reports its own results."""
