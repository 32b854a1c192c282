"""The ultrafast-pycocotools backend: pycocotools' object model over a multithreaded Rust core."""

from __future__ import annotations

import contextlib
import io
from types import ModuleType
from typing import Any

from detrkit.training.coco_backends.base import CocoInputs
from detrkit.training.coco_backends.cocoapi import PackageCocoBackend, coco_dataset, compressed_rles


class UfcocoBackend(PackageCocoBackend):
    package = "ultrafast_pycocotools"
    distribution = "ultrafast-pycocotools"

    def _package(self) -> tuple[type, type, ModuleType]:
        package = self.module
        return package.COCO, package.COCOeval, package.mask

    def _ground_truth(self, inputs: CocoInputs) -> Any:
        coco, _, mask = self._package()
        dataset = coco_dataset(inputs, compressed_rles(mask, inputs.gt_rles, inputs.gt_sizes()))
        return coco(dataset, verbose=False)  # borrows the dict; pycocotools' progress lines off

    def _detections(self, gt: Any, inputs: CocoInputs) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):  # the array route prints pycocotools' lines
            return super()._detections(gt, inputs)

    def _evaluator(self, coco_eval: type, gt: Any, dt: Any, iou_type: str) -> Any:
        return coco_eval(gt, dt, iou_type, print_function=_silent)


def _silent(*_: object) -> None:
    """ultrafast-pycocotools prints each stage, as pycocotools does; the metric reports its own."""
