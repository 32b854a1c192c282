"""Read checkpoint files safely and fit their weights to a configured Detector (fine-tuning rules)."""

from __future__ import annotations

import argparse
import logging
import pickle
import types
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from detrkit.models.heads.box import tile_rows
from detrkit.models.heads.keypoint import reset_precision_rows
from detrkit.ops.position import resize_grid_embeddings

if TYPE_CHECKING:
    from detrkit.models.detector import Detector

logger = logging.getLogger(__name__)

# The only non-tensor classes a checkpoint may hold: legacy training arguments.
SAFE_CLASSES = [argparse.Namespace, types.SimpleNamespace]
# Prefixes that Lightning and torch.compile put before the detector's own keys.
_WRAPPER_PREFIXES = ("model.", "_orig_mod.")
_POSITION_KEY = "backbone.0.encoder.encoder.embeddings.position_embeddings"
_PATCH_KEY = "backbone.0.encoder.encoder.embeddings.patch_embeddings.projection.weight"
_MASK_HEAD_PREFIX = "segmentation_head."
_KEYPOINT_HEAD_PREFIX = "keypoint_embed."
_PROJECTOR_PREFIX = "backbone.0.projector."
_SECOND_PROJECTOR_PREFIX = "backbone.0.cross_attn_projector."
# a standalone keypoint projection the published keypoint preview still stores; nothing reads it
_UNUSED_PREFIXES = ("keypoint_head.keypoint_proj.",)
_QUERY_KEYS = ("refpoint_embed.weight", "query_feat.weight")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or that does not fit the configured model."""


@dataclass
class Checkpoint:
    """A checkpoint's weights (plain detector keys) and the metadata saved beside them."""

    path: Path
    weights: dict[str, torch.Tensor]
    args: dict[str, Any] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None

    @property
    def num_logits(self) -> int:
        return self.weights["class_embed.bias"].shape[0]

    @property
    def class_names(self) -> list[str] | None:
        names = self.args.get("class_names") or self.model_config.get("class_names")
        return list(names) if names else None


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Load a published `.pth`, a Lightning `.ckpt` or a detrkit file without unpickling code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        with torch.serialization.safe_globals(SAFE_CLASSES):
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path} holds objects that are not safe to load (only tensors and plain training "
            f"arguments are allowed): {str(error).splitlines()[0]}") from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {error}") from error
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} holds a {type(raw).__name__}, not a checkpoint dictionary")
    return Checkpoint(path, _plain_weights(raw, path), _as_dict(raw.get("args") or raw.get("hyper_parameters")),
                      _as_dict(raw.get("model_config")), raw.get("model_name"))


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):
        return vars(value)
    return dict(value) if isinstance(value, dict) else {}


def _plain_weights(raw: dict, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(raw.get("model"), dict):
        weights = raw["model"]
    elif isinstance(raw.get("state_dict"), dict):
        weights = {_strip_wrappers(k): v for k, v in raw["state_dict"].items()}
    else:
        raise CheckpointError(f"{path} has neither a 'model' nor a 'state_dict' entry (keys: {sorted(raw)[:10]})")
    if "class_embed.bias" not in weights:
        raise CheckpointError(f"{path} is not an RF-DETR checkpoint: it has no class_embed weights")
    return {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}


def _strip_wrappers(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, stripped = key[len(prefix):], True
    return key


def fit_weights(checkpoint: Checkpoint, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint's weights reshaped to `model`: class head tiled or truncated, query rows
    sliced per group, position embeddings resized. Raises CheckpointError on a different model."""
    target = model.state_dict()
    weights = {k: v for k, v in checkpoint.weights.items() if not k.startswith(_UNUSED_PREFIXES)}
    _check_patch_size(checkpoint, target)
    _check_optional_heads(checkpoint, target)
    _seed_second_projector(weights, target)
    num_logits = target["class_embed.bias"].shape[0]
    for key, value in weights.items():
        if _is_class_head(key) and value.shape[0] != num_logits:
            weights[key] = tile_rows(value, num_logits)
    for key in _QUERY_KEYS:
        if key in weights and key in target and weights[key].shape[1:] == target[key].shape[1:]:
            # detrkit's own files keep num_queries in model_config, published ones in args
            layout = {**checkpoint.args, **checkpoint.model_config}
            weights[key] = _fit_query_rows(weights[key], target[key], layout, model.groups)
    if _POSITION_KEY in weights and _POSITION_KEY in target:
        weights[_POSITION_KEY] = resize_position_embeddings(weights[_POSITION_KEY], target[_POSITION_KEY].shape[1])
    _check_compatible(checkpoint.path, weights, target)
    return weights


def _is_class_head(key: str) -> bool:
    return key.startswith("class_embed.") or key.startswith("transformer.enc_out_class_embed.")


def _check_patch_size(checkpoint: Checkpoint, target: dict[str, torch.Tensor]) -> None:
    if _PATCH_KEY not in checkpoint.weights or _PATCH_KEY not in target:
        return
    saved, wanted = checkpoint.weights[_PATCH_KEY].shape[-1], target[_PATCH_KEY].shape[-1]
    if saved != wanted:
        raise CheckpointError(
            f"{checkpoint.path} was trained with patch size {saved}, the model is configured with "
            f"patch_size={wanted}; pick the matching model class")


# optional heads: key prefix, the config flag that declares them, how errors name them and a class that has them
_OPTIONAL_HEADS = (
    (_MASK_HEAD_PREFIX, "segmentation_head", "a segmentation head", "a segmentation class such as RFDETRSegNano"),
    (_KEYPOINT_HEAD_PREFIX, "use_grouppose_keypoints", "keypoint heads",
     "a keypoint class such as RFDETRKeypointPreview"),
)


def _check_optional_heads(checkpoint: Checkpoint, target: dict[str, torch.Tensor]) -> None:
    """A checkpoint with a segmentation or keypoint head needs a model with it; one saved without
    it (its config says so) needs a model without it."""
    declared = {**checkpoint.args, **checkpoint.model_config}
    for prefix, flag, head, model_with_it in _OPTIONAL_HEADS:
        saved = any(key.startswith(prefix) for key in checkpoint.weights)
        wanted = any(key.startswith(prefix) for key in target)
        if saved and not wanted:
            raise CheckpointError(f"{checkpoint.path} was trained with {head} and the model has none; "
                                  f"load it into {model_with_it}")
        if wanted and not saved and declared.get(flag) is False:
            raise CheckpointError(f"{checkpoint.path} was trained without {head} but the model has {head}; "
                                  "load it into a detection class such as RFDETRNano")


def _seed_second_projector(weights: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
    """A dual-projector model loading weights without a second projector starts it as a copy of
    the first."""
    if any(k.startswith(_SECOND_PROJECTOR_PREFIX) for k in weights):
        return
    if not any(k.startswith(_SECOND_PROJECTOR_PREFIX) for k in target):
        return
    for key in [k for k in weights if k.startswith(_PROJECTOR_PREFIX)]:
        weights[_SECOND_PROJECTOR_PREFIX + key[len(_PROJECTOR_PREFIX):]] = weights[key].clone()


def _fit_query_rows(saved: torch.Tensor, current: torch.Tensor, args: dict[str, Any],
                    model_groups: int) -> torch.Tensor:
    """Copy the saved rows into the model's rows, group by group when the group layout is known."""
    fitted = current.clone()
    queries, groups = args.get("num_queries"), args.get("group_detr")
    if queries and groups and queries * groups == saved.shape[0]:
        width = saved.shape[1]
        source = saved.view(groups, queries, width)
        dest = fitted.view(model_groups, -1, width)
        g, n = min(groups, model_groups), min(queries, dest.shape[1])
        dest[:g, :n] = source[:g, :n]
        return fitted
    rows = min(saved.shape[0], current.shape[0])
    fitted[:rows] = saved[:rows]
    return fitted


def resize_position_embeddings(table: torch.Tensor, rows: int) -> torch.Tensor:
    """(1, 1 + g*g, C) table -> (1, rows, C): bicubic resize of the patch grid, CLS row kept."""
    if table.shape[1] == rows:
        return table
    side = round((rows - 1) ** 0.5)
    return torch.cat((table[:, :1], resize_grid_embeddings(table[0, 1:], side, side)[None]), 1)


def _check_compatible(path: Path, weights: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
    mismatched = [f"{k}: file {tuple(weights[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in target.items() if k in weights and weights[k].shape != v.shape]
    if mismatched:
        raise CheckpointError(
            f"{path} does not fit the configured model ({len(mismatched)} tensors differ, e.g. "
            f"{'; '.join(mismatched[:3])}); was it saved from another model class?")
    missing = [k for k in target if k not in weights and k != "_kp_active_mask"]
    if len(missing) > len(target) // 2:
        raise CheckpointError(f"{path} lacks {len(missing)} of the model's {len(target)} tensors "
                              f"(e.g. {missing[:3]}); it holds another architecture")
    unexpected = [k for k in weights if k not in target]
    if missing or unexpected:
        warnings.warn(f"{path}: {len(missing)} tensors missing (kept at initial values: {missing[:5]}), "
                      f"{len(unexpected)} unexpected (ignored: {unexpected[:5]})", stacklevel=3)


def load_weights(model: torch.nn.Module, checkpoint: Checkpoint) -> None:
    """Fit and load the checkpoint into `model` in place."""
    model.load_state_dict(fit_weights(checkpoint, model), strict=False)
    logger.info("loaded weights from %s", checkpoint.path)


def reset_keypoint_precision(model: Detector) -> None:
    """Zero the precision outputs (slot channels 4..6, weights and biases) of the keypoint head
    and of its per-group encoder copies: done after loading pretrained weights for training, so
    fine-tuning starts every keypoint at unit precision. No-op for models without keypoints."""
    if model.keypoint_embed is None:
        return
    reset_precision_rows(model.keypoint_embed)
    for copy in model.transformer.enc_out_keypoint_embed:
        reset_precision_rows(copy)
