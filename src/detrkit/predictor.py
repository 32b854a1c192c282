"""predict() for anything that runs a DeployGraph: the PyTorch model and exported files share this one implementation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from detrkit.datasets.coco_categories import COCO_CATEGORIES
from detrkit.datasets.images import BatchPreparer, ImageInput, to_source_image, to_tensor
from detrkit.datasets.sources import open_source
from detrkit.key_points import as_key_points
from detrkit.models.deploy_graph import to_pixel_results
from detrkit.models.postprocess import detections_above, keypoint_pixel_covariance

if TYPE_CHECKING:
    import supervision as sv


def class_name_of(class_id: int, num_classes: int, names: Sequence[str] | None) -> str:
    """Name of a predicted class id: raw COCO ids for COCO-pretrained heads, else an index into
    `names`, whose extra last slot is the background."""
    coco_head = num_classes == 90 and (names is None or set(names) == set(COCO_CATEGORIES.values()))
    if coco_head:
        return COCO_CATEGORIES.get(class_id, str(class_id))
    if class_id == num_classes:
        return "__background__"
    return names[class_id] if names is not None and class_id < len(names) else str(class_id)


class Predictor:
    """predict() over `_run_graph`, which subclasses give: normalised (B, C, H, W) pixels ->
    DeployGraph outputs by name. Subclasses also give `num_classes`, `class_names`, `_channels`,
    `_block_size`, `_default_size` and `_device`."""

    class_names: list[str] | None
    _preparers: dict[tuple[int, int], BatchPreparer]

    def _run_graph(self, pixels: torch.Tensor, raw: bool = False) -> dict[str, torch.Tensor]:
        """DeployGraph outputs by name (with `raw`, the heads' own outputs)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        raise NotImplementedError

    def predict(self, images: ImageInput | Sequence[ImageInput] | Iterator[ImageInput], threshold: float = 0.5,
                shape: tuple[int, int] | None = None, *, batch: int | None = None, stream: bool = False,
                vid_stride: int = 1, include_source_image: bool = True,
                ) -> sv.Detections | sv.KeyPoints | list[sv.Detections | sv.KeyPoints] | Iterator:
        """Detect objects; one `supervision.Detections` (keypoint models: `KeyPoints`) per image or frame.

        Sources: an image (path, PIL image, HWC uint8 RGB array, CHW tensor: uint8 or float in
        [0, 1]) gives one Detections; a directory (its images, by name), a glob ("imgs/*.jpg"), a
        video file, a list or tuple of any of these, or an iterator of images give a list.
        Keywords: `threshold` (strict); `shape` (H, W) to resize to (default: the resolution);
        `batch` images per forward pass (default: a list of images at once, anything else one
        at a time); `stream=True` returns a generator that reads each image only when its batch
        is due; `vid_stride=N` keeps every N-th video frame; `include_source_image` stores the
        HWC uint8 image in `detections.metadata["source_image"]`. Missing paths raise at once.
        Segmentation models fill `detections.mask`: (N, H, W) bool in the source image's pixels.
        Keypoint models return `supervision.KeyPoints`, as rfdetr does: `xy` (N, K, 2) in source
        pixels, `keypoint_confidence` (N, K) σ(findable), `detection_confidence` (N,) the score the
        threshold compares (fused with keypoint uncertainty, see postprocess_trace_alpha), `class_id`;
        `data` holds the boxes as "xyxy" (N, 4), "covariance" (N, K, 2, 2) in pixels², the raw
        "keypoint_precision_cholesky" (N, K, 3), "class_name", "source_shape" and, per row,
        "source_image" (KeyPoints has no metadata). See key_points.as_key_points.
        """
        source = open_source(images, batch=batch, vid_stride=vid_stride)
        preparer = self._preparer(shape)
        results = (detections for chunk in source.batches()
                   for detections in self._detect_batch(chunk, threshold, preparer, include_source_image))
        if stream:
            return results
        return next(results) if source.single else list(results)

    def _detect_batch(self, images: list[ImageInput], threshold: float, preparer: BatchPreparer,
                      include_source_image: bool) -> list[sv.Detections | sv.KeyPoints]:
        """One forward pass over `images`, each resized by `preparer`."""
        tensors = [to_tensor(image, self._channels) for image in images]
        sizes = torch.tensor([t.shape[-2:] for t in tensors])
        with torch.inference_mode():
            outputs = self._run_graph(preparer(tensors))
            results = to_pixel_results(outputs, sizes.to(outputs["boxes"].device))
        return [self._to_detections(result, threshold, tuple(size.tolist()),
                                    to_source_image(tensor) if include_source_image else None)
                for result, size, tensor in zip(results, sizes, tensors)]

    def _preparer(self, shape: tuple[int, int] | None) -> BatchPreparer:
        size = tuple(shape) if shape else self._default_size
        block = self._block_size
        if len(size) != 2 or any(side <= 0 or side % block for side in size):
            raise ValueError(f"shape={shape} must be two positive sides divisible by {block}")
        if size not in self._preparers:
            self._preparers[size] = BatchPreparer(size, self._channels, self._device)
        return self._preparers[size]

    def _to_detections(self, result: dict[str, torch.Tensor], threshold: float, source_shape: tuple[int, int],
                       source_image: np.ndarray | None = None) -> sv.Detections | sv.KeyPoints:
        """Detections above `threshold`, with (N, H, W) bool masks at the source size for segmentation
        models, as KeyPoints for keypoint models; the same dtypes whether empty or not."""
        import supervision as sv  # heavy import, deferred so that `import detrkit` stays fast

        kept = detections_above(result, threshold, source_shape)
        class_id = kept["labels"].cpu().numpy().astype(np.int64, copy=False)
        detections = sv.Detections(
            xyxy=kept["boxes"].float().cpu().numpy().reshape(-1, 4),
            confidence=kept["scores"].float().cpu().numpy(),
            class_id=class_id, mask=kept["masks"].cpu().numpy() if "masks" in kept else None)
        detections.data["class_name"] = np.array([self.class_name(int(c)) for c in class_id], dtype=object)
        detections.data["source_shape"] = np.tile(np.array(source_shape, dtype=np.int64), (len(class_id), 1))
        if source_image is not None:
            detections.metadata["source_image"] = source_image
        if "keypoints" in kept:
            covariance = keypoint_pixel_covariance(kept["keypoint_precision_cholesky"].cpu().double(), source_shape)
            return as_key_points(detections, kept, covariance, source_image)
        return detections

    def class_name(self, class_id: int) -> str:
        """Name of a predicted class id: raw COCO ids for COCO-pretrained heads, else an index
        into class_names, whose extra last slot is the background."""
        return class_name_of(class_id, self.num_classes, self.class_names)
