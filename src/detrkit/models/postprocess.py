"""Turn raw detector outputs into scored, labelled boxes (and their masks or keypoints) in image pixels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from detrkit.models.heads.keypoint import active_keypoint_mask
from detrkit.ops.boxes import cxcywh_to_xyxy
from detrkit.structures import DetectorOutput


def ordered_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of (B, N) values and their indices, descending, equal values in index order
    (also at the cut: of tied values, the lower indices make it).

    torch.topk leaves both open, so eager code takes the head of a stable sort (N is at most a
    few ten thousand); ONNX's TopK breaks ties by the lower index by definition, so an exported
    graph uses it (export has no stable sort).
    """
    if torch.onnx.is_in_onnx_export():
        return values.topk(k, dim=1)
    scores, index = values.sort(dim=1, descending=True, stable=True)
    return scores[:, :k], index[:, :k]


def top_detections_batched(logits: torch.Tensor, boxes: torch.Tensor, image_sizes: torch.Tensor,
                           num_select: int, masks: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`top_detections` as batch-first tensors: "scores" (B, K), "labels" (B, K), "boxes"
    (B, K, 4) and with masks "masks" (B, K, h, w); no loop over the batch (an exported graph
    keeps its batch axis free)."""
    _, queries, classes = logits.shape
    probs = logits.sigmoid().flatten(1)  # (B, Q*C)
    scores, index = ordered_topk(probs, min(num_select, queries * classes))
    query = torch.div(index, classes, rounding_mode="floor")
    xyxy = cxcywh_to_xyxy(boxes).gather(1, query[..., None].expand(-1, -1, 4))
    height, width = image_sizes.to(xyxy.dtype).unbind(1)
    scale = torch.stack((width, height, width, height), 1)[:, None]  # (B, 1, 4)
    xyxy = torch.minimum((xyxy * scale).clamp(min=0), scale)
    result = {"scores": scores, "labels": index % classes, "boxes": xyxy}
    if masks is not None:
        result["masks"] = masks.gather(1, query[..., None, None].expand(-1, -1, *masks.shape[-2:]))  # (B, K, h, w)
    return result


def unbatch(batched: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Batch-first tensors by name -> one dict per image."""
    count = len(next(iter(batched.values())))
    return [{name: value[index] for name, value in batched.items()} for index in range(count)]


def top_detections(logits: torch.Tensor, boxes: torch.Tensor, image_sizes: torch.Tensor,
                   num_select: int, masks: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
    """Best (query, class) pairs per image.

    logits (B, Q, C), boxes (B, Q, 4) normalised cxcywh, image_sizes (B, 2) as (H, W).
    Returns per image {"scores" (K,), "labels" (K,), "boxes" (K, 4) xyxy pixels clamped to the
    image}, K = min(num_select, Q * C), sorted by descending score (ties keep query order).
    With masks (B, Q, h, w) logits, also "masks" (K, h, w): the selected queries' logits, for
    masks_at_size to bring to an image size.
    """
    return unbatch(top_detections_batched(logits, boxes, image_sizes, num_select, masks))


def masks_at_size(logits: torch.Tensor, valid: tuple[int, int], size: tuple[int, int],
                  chunk: int = 32) -> torch.Tensor:
    """(K, H, W) bool masks from (K, h, w) logits over a padded input: the top-left `valid` (rows,
    columns) cover the image; they are upsampled bilinearly (align_corners=False) to `size` and
    thresholded at 0. `chunk` masks at a time bound the float upsampling memory. A mask without a
    positive logit is left all False without upsampling: each output is a convex combination of
    logits, so it cannot be positive either."""
    cropped = logits[:, :valid[0], :valid[1]].float()
    out = torch.zeros((len(logits), *size), dtype=torch.bool, device=logits.device)
    some = (cropped > 0).flatten(1).any(1).nonzero().flatten()  # one transfer, not one per mask
    for start in range(0, len(some), chunk):
        rows = some[start:start + chunk]
        part = cropped[rows, None]  # (k, 1, hv, wv)
        out[rows] = F.interpolate(part, size=size, mode="bilinear", align_corners=False)[:, 0] > 0
    return out


def positive_windows(logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(K, 4) int64 [y0, y1, x0, x1): for (K, h, w) logits upsampled as masks_at_size does to
    `size`, output rows and columns outside which no pixel can be positive (empty where a mask has
    no positive logit). Bilinear output (align_corners=False) at row Y blends source rows
    floor(s) and floor(s) + 1, s = (Y + 0.5) h / H - 0.5, so it can exceed 0 only when
    a - 1 <= s < b + 1 for the first and last rows a, b holding a positive logit; the same for
    columns. The bounds are widened by one pixel against rounding."""
    positive = logits > 0
    rows, columns = positive.any(2), positive.any(1)  # (K, h), (K, w)
    spans = [_positive_span(rows, size[0]), _positive_span(columns, size[1])]
    windows = torch.cat(spans, dim=1)
    empty = ~rows.any(1)
    windows[empty] = 0
    return windows


def _positive_span(hits: torch.Tensor, out_size: int) -> torch.Tensor:
    """(K, 2) [first, end) output indices along one axis for (K, n) "has a positive logit" flags."""
    n = hits.shape[1]
    index = torch.arange(n, device=hits.device)
    first = torch.where(hits, index, n).amin(1).double()
    last = torch.where(hits, index, -1).amax(1).double()
    scale = n / out_size
    begin = torch.floor((first - 0.5) / scale - 0.5) - 1
    end = torch.ceil((last + 1.5) / scale - 0.5) + 1
    return torch.stack([begin.clamp(0, out_size), end.clamp(0, out_size)], dim=1).long()


def valid_mask_region(mask_size: tuple[int, int], padded_size: tuple[int, int],
                      image_size: tuple[int, int]) -> tuple[int, int]:
    """Rows and columns of a (h, w) mask over a padded (H_pad, W_pad) input that cover the
    unpadded (H, W) image at its top left."""
    return tuple(min(m, math.ceil(i * m / p)) for m, p, i in zip(mask_size, padded_size, image_size))


def detections_above(result: dict[str, torch.Tensor], threshold: float,
                     image_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """One image's detections from `top_detections` scoring above `threshold` (strict). Their
    "masks" logits, taken over an unpadded input, become (N, H, W) bool masks at `image_size`:
    only the kept ones are upsampled."""
    keep = (result["scores"] > threshold).nonzero(as_tuple=True)[0]
    kept = {name: value[keep] for name, value in result.items()}
    if "masks" in kept:
        kept["masks"] = masks_at_size(kept["masks"], tuple(kept["masks"].shape[-2:]), image_size)
    return kept


def top_keypoint_detections_batched(logits: torch.Tensor, boxes: torch.Tensor, keypoints: torch.Tensor,
                                    image_sizes: torch.Tensor, num_select: int,
                                    num_keypoints_per_class: Sequence[int],
                                    trace_alpha: float) -> dict[str, torch.Tensor]:
    """`top_keypoint_detections` as batch-first tensors (see top_detections_batched)."""
    # top_detections_batched gathers any per-query (B, Q, a, b) tensor handed to it as masks
    result = top_detections_batched(logits, boxes, image_sizes, num_select, masks=keypoints)
    picked = result.pop("masks")  # (B, K, slots, 8)
    result["scores"], result["keypoints"], result["keypoint_precision_cholesky"] = keypoint_outputs(
        picked, result["labels"], result["scores"], image_sizes, num_keypoints_per_class, trace_alpha)
    return result


def top_keypoint_detections(logits: torch.Tensor, boxes: torch.Tensor, keypoints: torch.Tensor,
                            image_sizes: torch.Tensor, num_select: int, num_keypoints_per_class: Sequence[int],
                            trace_alpha: float) -> list[dict[str, torch.Tensor]]:
    """`top_detections` of a keypoint model, each with its keypoints (spec 10.1 step 4).

    keypoints (B, Q, classes * max keypoints, 8) as the keypoint head lays them out. Adds per
    image "keypoints" and "keypoint_precision_cholesky" (K, max keypoints, 3), and replaces
    "scores" by the fused ones (see keypoint_outputs); the order stays the selection's.
    """
    return unbatch(top_keypoint_detections_batched(logits, boxes, keypoints, image_sizes, num_select,
                                                   num_keypoints_per_class, trace_alpha))


def keypoint_outputs(keypoints: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor, image_sizes: torch.Tensor,
                     num_keypoints_per_class: Sequence[int],
                     trace_alpha: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keypoints and fused scores of selected detections, without host syncs.

    keypoints (B, K, classes * W, 8) the detections' slots (W = most keypoints of a class),
    labels and scores (B, K), image_sizes (B, 2) as (H, W). A detection of a keypoint class
    (label < classes) takes its class's slots; its active keypoints give (x * W, y * H,
    σ(findable)) and raw (log l11, l21, log l22), the rest zeros and NaNs. With trace_alpha > 0
    its score becomes σ(log score − α · log mean trace), capped just below 1, the trace weighted
    by σ(findable) over its active keypoints (0 for a class without any). Returns scores (B, K),
    keypoints (B, K, W, 3) and precision Cholesky parameters (B, K, W, 3).
    """
    classes, width = len(num_keypoints_per_class), max(num_keypoints_per_class, default=0)
    if classes == 0 or width == 0:
        return scores, keypoints.new_zeros((*labels.shape, 0, 3)), keypoints.new_zeros((*labels.shape, 0, 3))
    own = labels.clamp(max=classes - 1)
    slots = keypoints.unflatten(-2, (classes, width))  # (B, K, classes, W, 8)
    picked = slots.gather(2, own[..., None, None, None].expand(-1, -1, 1, width, slots.shape[-1]))[:, :, 0]
    is_keypoint_class = labels < classes  # (B, K)
    active = active_keypoint_mask(num_keypoints_per_class).to(labels.device)[own] & is_keypoint_class[..., None]
    height, image_width = image_sizes.to(keypoints.dtype).unbind(-1)
    scale = torch.stack((image_width, height), -1)[:, None, None]  # (B, 1, 1, 2)
    points = torch.cat((picked[..., :2] * scale, picked[..., 2:3].sigmoid()), -1)
    points = torch.where(active[..., None], points, 0.0)
    precision = torch.where(active[..., None], picked[..., 4:7], float("nan"))
    if trace_alpha > 0:
        fused = torch.sigmoid(scores.log() - trace_alpha * _log_mean_trace(picked, active))
        below_one = 1.0 - torch.finfo(fused.dtype).eps / 2  # the largest float below 1: nextafter(1, 0)
        scores = torch.where(is_keypoint_class, fused.clamp(max=below_one), scores)
    return scores, points, precision


def _log_mean_trace(keypoints: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """(B, K) log of the σ(findable)-weighted mean, over active keypoints, of the location
    covariance's trace; 0 where none is active. keypoints (B, K, W, 8), active (B, K, W).

    The precision is L Lᵀ with L = [[l11, 0], [l21, l22]], so the covariance's trace is
    1/l11² + 1/l22² + l21²/(l11² l22²); summed in log space, which stays finite for very sharp
    or very loose predictions. |l21| and the weights are floored at 1e-12 before their logs.
    """
    log_l11, l21, log_l22 = keypoints[..., 4], keypoints[..., 5], keypoints[..., 6]
    terms = (-2 * log_l11, -2 * log_l22, 2 * l21.abs().clamp(min=1e-12).log() - 2 * log_l11 - 2 * log_l22)
    log_trace = torch.stack(terms, -1).logsumexp(-1)  # (B, K, W)
    log_weight = keypoints[..., 2].sigmoid().clamp(min=1e-12).log()
    log_weight = torch.where(active, log_weight, float("-inf"))
    mean = (log_trace + log_weight).logsumexp(-1) - log_weight.logsumexp(-1)
    return torch.where(active.any(-1), mean, 0.0)


def select_detections_batched(outputs: DetectorOutput, image_sizes: torch.Tensor, num_select: int,
                              num_keypoints_per_class: Sequence[int] = (),
                              trace_alpha: float = 0.0) -> dict[str, torch.Tensor]:
    """`top_keypoint_detections_batched` of outputs with keypoints, else `top_detections_batched`
    (with the mask logits of outputs with masks); scores and boxes from fp32 logits and boxes."""
    logits, boxes = outputs.pred_logits.float(), outputs.pred_boxes.float()
    if outputs.pred_keypoints is not None:
        return top_keypoint_detections_batched(logits, boxes, outputs.pred_keypoints.float(), image_sizes,
                                               num_select, num_keypoints_per_class, trace_alpha)
    return top_detections_batched(logits, boxes, image_sizes, num_select, masks=outputs.pred_masks)


def select_detections(outputs: DetectorOutput, image_sizes: torch.Tensor, num_select: int,
                      num_keypoints_per_class: Sequence[int] = (),
                      trace_alpha: float = 0.0) -> list[dict[str, torch.Tensor]]:
    """`select_detections_batched`, one dict per image."""
    return unbatch(select_detections_batched(outputs, image_sizes, num_select, num_keypoints_per_class, trace_alpha))


def keypoint_pixel_covariance(precision_cholesky: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """(N, K, 2, 2) location covariance in pixels of keypoints predicted in an (H, W) image.

    precision_cholesky (N, K, 3) holds (log l11, l21, log l22) in normalised coordinates: the
    precision is L Lᵀ with L = [[l11, 0], [l21, l22]], so the covariance is its closed-form
    inverse, then scaled by diag(W, H) on both sides. Keypoints whose parameters or covariance
    are not finite (inactive ones: NaN) get NaN. Computed in the input's dtype.
    """
    log_l11, l21, log_l22 = precision_cholesky.unbind(-1)
    l11, l22 = log_l11.exp(), log_l22.exp()
    inverse_det = 1 / (l11 * l22) ** 2  # det(L Lᵀ) = (l11 l22)²
    off_diagonal = -l11 * l21 * inverse_det + 0.0  # + 0.0 turns -0.0 into 0.0
    rows = (((l21 ** 2 + l22 ** 2) * inverse_det, off_diagonal), (off_diagonal, l11 ** 2 * inverse_det))
    covariance = torch.stack([torch.stack(row, -1) for row in rows], -2)  # (N, K, 2, 2)
    height, width = image_size
    scale = precision_cholesky.new_tensor([width, height])
    covariance = covariance * scale[:, None] * scale[None, :]
    finite = covariance.isfinite().flatten(-2).all(-1) & precision_cholesky.isfinite().all(-1)  # (N, K)
    return torch.where(finite[..., None, None], covariance, float("nan"))
