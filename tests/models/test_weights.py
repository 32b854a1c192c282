"""Tests that checkpoint files are read safely and fitted to the configured detector (spec 11.3, 11.4)."""

from __future__ import annotations

import argparse
import pickle
import re
import types
from pathlib import Path

import pytest
import torch

from detrkit import RFDETRNano
from detrkit.models.heads.box import tile_rows
from detrkit.models.weights import (
    CheckpointError,
    fit_weights,
    read_checkpoint,
    resize_position_embeddings,
)

POSITION_KEY = "backbone.0.encoder.encoder.embeddings.position_embeddings"
CLASS_HEAD_KEYS = ["class_embed.weight", "class_embed.bias"] + [
    f"transformer.enc_out_class_embed.{g}.{p}" for g in range(3) for p in ("weight", "bias")
]
NAMES = ["cat", "dog", "fox", "owl", "eel"]
# fit_weights guesses the model's group count from its row count (weights._model_groups) instead
# of reading model.groups, so any model whose group count differs from the file's gets wrong rows.


def tiny(kwargs: dict, seed: int = 0, **changes) -> RFDETRNano:
    """A tiny model whose every parameter is distinct (biases and query rows too)."""
    torch.manual_seed(seed)
    model = RFDETRNano(**{**kwargs, **changes})
    with torch.no_grad():
        for param in model.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def outputs(model: RFDETRNano, size: tuple[int, int] = (64, 64)) -> tuple[torch.Tensor, torch.Tensor]:
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model.model(pixels)
    return out["pred_logits"], out.pred_boxes


def save_published(model: RFDETRNano, path: Path, legacy: bool = False, **args) -> Path:
    payload = {"model": model.model.state_dict(), "args": argparse.Namespace(**args)}
    torch.save(payload, path, _use_new_zipfile_serialization=not legacy)
    return path


def save_lightning(model: RFDETRNano, path: Path, prefix: str = "model.", **extra) -> Path:
    state = {prefix + k: v for k, v in model.model.state_dict().items()}
    torch.save({"state_dict": state, "model_config": model.model_config.model_dump(), **extra}, path)
    return path


def load(kwargs: dict, path: Path, **changes) -> RFDETRNano:
    torch.manual_seed(99)  # a different initialisation than the saved model's
    return RFDETRNano(**{**kwargs, "pretrain_weights": str(path), **changes})


# -- reading the supported layouts ---------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_published_layout_reproduces_saved_outputs(tiny_kwargs, tmp_path, legacy):
    source = tiny(tiny_kwargs)
    path = save_published(source, tmp_path / "weights.pth", legacy, num_queries=12, group_detr=3,
                          class_names=NAMES)
    loaded = load(tiny_kwargs, path)
    for got, want in zip(outputs(loaded), outputs(source)):
        assert torch.equal(got, want)
    assert loaded.class_names == NAMES


@pytest.mark.parametrize("prefix", ["model.", "model._orig_mod."])
def test_lightning_layout_reproduces_saved_outputs(tiny_kwargs, tmp_path, prefix):
    source = tiny(tiny_kwargs)
    path = save_lightning(source, tmp_path / "last.ckpt", prefix)
    checkpoint = read_checkpoint(path)
    assert set(checkpoint.weights) == set(source.model.state_dict())
    assert checkpoint.model_config["hidden_dim"] == 32
    loaded = load(tiny_kwargs, path)
    for got, want in zip(outputs(loaded), outputs(source)):
        assert torch.equal(got, want)


def test_loaded_weights_equal_saved_tensors(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    loaded = load(tiny_kwargs, save_published(source, tmp_path / "w.pth"))
    saved, got = source.model.state_dict(), loaded.model.state_dict()
    assert saved.keys() == got.keys()
    for key in saved:
        assert torch.equal(saved[key], got[key]), key


@pytest.mark.parametrize("args", [
    {"class_names": NAMES, "num_queries": 12},
    types.SimpleNamespace(class_names=NAMES, num_queries=12),
    argparse.Namespace(class_names=NAMES, num_queries=12),
], ids=["dict", "SimpleNamespace", "Namespace"])
def test_args_are_read_as_a_dict_from_any_saved_form(tiny_kwargs, tmp_path, args):
    path = tmp_path / "w.pth"
    torch.save({"model": tiny(tiny_kwargs).model.state_dict(), "args": args}, path)
    checkpoint = read_checkpoint(path)
    assert checkpoint.args == {"class_names": NAMES, "num_queries": 12}
    assert checkpoint.class_names == NAMES
    assert checkpoint.num_logits == 6
    assert checkpoint.path == path


def test_lightning_hyper_parameters_stand_in_for_missing_args(tiny_kwargs, tmp_path):
    path = save_lightning(tiny(tiny_kwargs), tmp_path / "x.ckpt",
                          hyper_parameters={"num_queries": 12, "group_detr": 3, "class_names": NAMES},
                          model_name="RFDETRNano")
    checkpoint = read_checkpoint(path)
    assert checkpoint.args["group_detr"] == 3
    assert checkpoint.class_names == NAMES
    assert checkpoint.model_name == "RFDETRNano"


def test_class_names_fall_back_to_the_model_config(tiny_kwargs, tmp_path):
    path = tmp_path / "x.ckpt"
    source = tiny(tiny_kwargs)
    state = {"model." + k: v for k, v in source.model.state_dict().items()}
    torch.save({"state_dict": state, "model_config": {"class_names": NAMES}}, path)
    assert read_checkpoint(path).class_names == NAMES


def test_non_tensor_entries_in_the_weights_are_dropped(tiny_kwargs, tmp_path):
    state = dict(tiny(tiny_kwargs).model.state_dict(), note="not a tensor", step=3)
    torch.save({"model": state}, tmp_path / "w.pth")
    weights = read_checkpoint(tmp_path / "w.pth").weights
    assert "note" not in weights and "step" not in weights
    assert "class_embed.bias" in weights


# -- unreadable and unsafe files -----------------------------------------------------------


def write_marker(path: str) -> None:
    Path(path).write_text("unpickled")


class ReducesToCall:
    """Unpickling this calls write_marker(marker): code the loader must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return write_marker, (self.marker,)


class SetsState:
    """Unpickling this runs __setstate__, which writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __getstate__(self):
        return {"marker": self.marker}

    def __setstate__(self, state):
        write_marker(state["marker"])
        self.__dict__.update(state)


@pytest.mark.parametrize("payload_class", [ReducesToCall, SetsState])
def test_arbitrary_classes_are_refused_without_unpickling(tiny_kwargs, tmp_path, payload_class):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.pth"
    torch.save({"model": tiny(tiny_kwargs).model.state_dict(), "args": payload_class(marker)}, path)
    # the trap works: a full unpickle does write the marker
    torch.load(path, weights_only=False)
    assert marker.read_text() == "unpickled"
    marker.unlink()

    with pytest.raises(CheckpointError, match=str(path)):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=str(path)):
        load(tiny_kwargs, path)
    assert not marker.exists()


def test_plain_pickle_of_a_class_is_refused(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"model": {}, "args": ReducesToCall(marker)}, protocol=2))
    with pytest.raises(CheckpointError, match=str(path)):
        read_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_truncated_file_raises_checkpoint_error_naming_it(tiny_kwargs, tmp_path, legacy):
    whole = save_published(tiny(tiny_kwargs), tmp_path / "whole.pth", legacy, num_queries=12)
    path = tmp_path / "half.pth"
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=str(path)):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=str(path)):
        load(tiny_kwargs, path)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_raise_checkpoint_error_naming_the_file(tmp_path, seed):
    path = tmp_path / f"noise{seed}.pth"
    path.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(seed),
                                   dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(CheckpointError, match=str(path)) as info:
        read_checkpoint(path)
    assert isinstance(info.value, ValueError)


def test_empty_file_raises_checkpoint_error(tmp_path):
    path = tmp_path / "empty.pth"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=str(path)):
        read_checkpoint(path)


@pytest.mark.parametrize("payload, words", [
    (torch.zeros(3), "Tensor"),
    ([1, 2, 3], "list"),
    ({"optimizer": {}}, "neither a 'model' nor a 'state_dict'"),
    ({"model": {"backbone.x": torch.zeros(1)}}, "no class_embed"),
])
def test_files_that_are_not_detector_checkpoints_are_refused(tmp_path, payload, words):
    path = tmp_path / "other.pth"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=str(path)) as info:
        read_checkpoint(path)
    assert words in str(info.value)


def test_missing_file_raises_file_not_found_naming_it(tiny_kwargs, tmp_path):
    path = tmp_path / "nowhere" / "weights.pth"
    with pytest.raises(FileNotFoundError, match=str(path)):
        read_checkpoint(path)
    with pytest.raises(FileNotFoundError, match=str(path)):
        load(tiny_kwargs, path)


# -- compatibility checks ------------------------------------------------------------------


@pytest.mark.parametrize("changes", [
    {"hidden_dim": 16},
    {"encoder_width": 32},
    {"dim_feedforward": 48},
], ids=["hidden_dim", "encoder_width", "dim_feedforward"])
def test_checkpoint_of_another_architecture_names_path_and_tensor(tiny_kwargs, tmp_path, changes):
    other = tiny(tiny_kwargs, **changes)
    path = save_published(other, tmp_path / "other.pth")
    wanted = RFDETRNano(**tiny_kwargs).model.state_dict()
    differing = [k for k, v in other.model.state_dict().items() if k in wanted and wanted[k].shape != v.shape]
    assert differing
    with pytest.raises(CheckpointError, match=str(path)) as info:
        load(tiny_kwargs, path)
    assert any(key in str(info.value) for key in differing)


def test_different_patch_size_is_refused_by_name(tiny_kwargs, tmp_path):
    path = save_published(tiny(tiny_kwargs, patch_size=8, positional_encoding_size=8), tmp_path / "p8.pth")
    with pytest.raises(CheckpointError, match="patch size") as info:
        load(tiny_kwargs, path)
    assert str(path) in str(info.value)
    assert re.search(r"\b8\b", str(info.value)) and re.search(r"\b16\b", str(info.value))


def test_checkpoint_lacking_most_tensors_is_another_architecture(tiny_kwargs, tmp_path):
    state = {k: v for k, v in tiny(tiny_kwargs).model.state_dict().items() if not k.startswith("backbone")}
    state = {k: v for k, v in state.items() if not k.startswith("transformer")}
    torch.save({"model": state}, tmp_path / "heads.pth")
    with pytest.raises(CheckpointError, match=str(tmp_path / "heads.pth")):
        load(tiny_kwargs, tmp_path / "heads.pth")


def test_a_few_missing_or_unexpected_tensors_warn_and_load_the_rest(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    state = dict(source.model.state_dict())
    del state["bbox_embed.layers.2.bias"]
    state["extra_head.weight"] = torch.ones(2)
    torch.save({"model": state}, tmp_path / "w.pth")
    with pytest.warns(UserWarning, match="bbox_embed.layers.2.bias") as record:
        loaded = load(tiny_kwargs, tmp_path / "w.pth")
    assert "extra_head.weight" in str(record[0].message)
    got = loaded.model.state_dict()
    assert torch.equal(got["class_embed.weight"], state["class_embed.weight"])
    assert torch.equal(got["bbox_embed.layers.2.bias"], torch.zeros(4))  # its initial value


def test_missing_kp_active_mask_loads_without_warning(tiny_kwargs, tmp_path, recwarn):
    source = tiny(tiny_kwargs)
    state = {k: v for k, v in source.model.state_dict().items() if k != "_kp_active_mask"}
    torch.save({"model": state}, tmp_path / "w.pth")
    loaded = load(tiny_kwargs, tmp_path / "w.pth")
    assert not [w for w in recwarn if "missing" in str(w.message)]
    for got, want in zip(outputs(loaded), outputs(source)):
        assert torch.equal(got, want)


# -- class head (spec 11.4 step 3, 6.4) ----------------------------------------------------


def test_tile_rows_repeats_then_truncates():
    rows = torch.arange(3.0)[:, None].expand(3, 2)
    assert tile_rows(rows, 7)[:, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert tile_rows(rows, 2)[:, 0].tolist() == [0, 1]
    assert torch.equal(tile_rows(rows, 3), rows)


@pytest.mark.parametrize("saved_classes", [5, 8, 2])
def test_omitted_num_classes_is_adopted_from_the_checkpoint(tiny_kwargs, tmp_path, saved_classes):
    source = tiny(tiny_kwargs, num_classes=saved_classes)
    path = save_published(source, tmp_path / "w.pth")
    kwargs = {k: v for k, v in tiny_kwargs.items() if k != "num_classes"}
    loaded = load(kwargs, path)
    assert loaded.model_config.num_classes == saved_classes
    assert loaded.model.num_classes == saved_classes
    for got, want in zip(outputs(loaded), outputs(source)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("num_classes", [2, 5, 13])
def test_requested_num_classes_tiles_or_truncates_every_class_head(tiny_kwargs, tmp_path, num_classes):
    source = tiny(tiny_kwargs)  # 6 logits
    path = save_published(source, tmp_path / "w.pth")
    loaded = load(tiny_kwargs, path, num_classes=num_classes)
    saved, got = source.model.state_dict(), loaded.model.state_dict()
    assert loaded.model.num_classes == num_classes
    for key in CLASS_HEAD_KEYS:
        assert got[key].shape[0] == num_classes + 1, key
        for row in range(num_classes + 1):
            assert torch.equal(got[key][row], saved[key][row % 6]), (key, row)
    # the rest of the network is untouched
    assert torch.equal(got["bbox_embed.layers.0.weight"], saved["bbox_embed.layers.0.weight"])
    logits, boxes = outputs(loaded)
    assert logits.shape == (2, 12, num_classes + 1)


# -- queries (spec 11.4 step 4) ------------------------------------------------------------


def group_rows(table: torch.Tensor, groups: int) -> torch.Tensor:
    """(groups * N, C) -> (groups, N, C)."""
    return table.reshape(groups, -1, table.shape[-1])


@pytest.mark.parametrize("queries, groups", [
    (6, 3), (16, 3),
    (12, 2), (6, 2),
    (12, 1), (4, 1),
    (12, 4),
])
def test_query_rows_are_sliced_group_by_group(tiny_kwargs, tmp_path, queries, groups):
    source = tiny(tiny_kwargs)  # 12 queries x 3 groups
    path = save_published(source, tmp_path / "w.pth", num_queries=12, group_detr=3)
    loaded = load(tiny_kwargs, path, num_queries=queries, num_select=queries, group_detr=groups)
    saved, got = source.model.state_dict(), loaded.model.state_dict()
    n, g = min(queries, 12), min(groups, 3)
    for key in ("refpoint_embed.weight", "query_feat.weight"):
        assert got[key].shape[0] == queries * groups
        want = group_rows(saved[key], 3)[:g, :n]
        have = group_rows(got[key], groups)[:g, :n]
        assert torch.equal(have, want), key


def test_query_rows_fall_back_to_a_flat_slice_without_group_layout(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    path = save_published(source, tmp_path / "w.pth")  # args say nothing of queries
    loaded = load(tiny_kwargs, path, num_queries=6, num_select=6, group_detr=2)
    saved, got = source.model.state_dict(), loaded.model.state_dict()
    for key in ("refpoint_embed.weight", "query_feat.weight"):
        assert torch.equal(got[key], saved[key][:12])


def test_fewer_groups_reproduce_the_source_outputs(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    path = save_published(source, tmp_path / "w.pth", num_queries=12, group_detr=3)
    loaded = load(tiny_kwargs, path, num_queries=12, num_select=12, group_detr=1)
    # eval uses group 0 only, and group 0 is copied whole
    for got, want in zip(outputs(loaded), outputs(source)):
        assert torch.equal(got, want)


# -- position embeddings (spec 11.4 step 6) ------------------------------------------------


def test_position_embeddings_of_the_same_grid_are_kept_as_they_are():
    table = torch.randn(1, 17, 8)
    assert torch.equal(resize_position_embeddings(table, 17), table)


def test_position_embedding_resize_keeps_cls_and_constants():
    table = torch.randn(1, 1, 5).expand(1, 17, 5).clone()  # every grid cell equal
    table[:, 0] = 42.0
    resized = resize_position_embeddings(table, 65)  # 4x4 -> 8x8
    assert resized.shape == (1, 65, 5)
    assert torch.equal(resized[:, 0], table[:, 0])
    assert torch.allclose(resized[:, 1:], table[:, 1:2].expand(1, 64, 5), atol=1e-5)


def test_position_embedding_resize_keeps_rows_as_rows():
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    table = torch.cat((torch.zeros(1, 2), torch.stack((rows, cols), -1).reshape(16, 2)))[None]
    for new in (3, 8):
        resized = resize_position_embeddings(table, 1 + new * new)[0, 1:].reshape(new, new, 2)
        # channel 0 varies only down the grid, channel 1 only across it, both increasing
        assert torch.allclose(resized[..., 0], resized[:, :1, 0].expand(new, new), atol=1e-5)
        assert torch.allclose(resized[..., 1], resized[:1, :, 1].expand(new, new), atol=1e-5)
        assert (resized[1:, 0, 0] > resized[:-1, 0, 0]).all()
        assert (resized[0, 1:, 1] > resized[0, :-1, 1]).all()


@pytest.mark.parametrize("grid", [2, 8])
def test_another_resolution_interpolates_position_embeddings_on_load(tiny_kwargs, tmp_path, grid):
    source = tiny(tiny_kwargs)  # 4x4 grid
    path = save_published(source, tmp_path / "w.pth")
    loaded = load(tiny_kwargs, path, resolution=grid * 16, positional_encoding_size=grid)
    saved = source.model.state_dict()[POSITION_KEY]
    got = loaded.model.state_dict()[POSITION_KEY]
    assert got.shape == (1, 1 + grid * grid, 48)
    assert torch.equal(got[:, 0], saved[:, 0])
    assert torch.allclose(got, resize_position_embeddings(saved, 1 + grid * grid))
    assert torch.equal(loaded.model.state_dict()["class_embed.weight"], source.model.state_dict()["class_embed.weight"])


def test_fit_weights_leaves_the_checkpoint_untouched(tiny_kwargs, tmp_path):
    source = tiny(tiny_kwargs)
    checkpoint = read_checkpoint(save_published(source, tmp_path / "w.pth", num_queries=12, group_detr=3))
    before = {k: v.clone() for k, v in checkpoint.weights.items()}
    target = RFDETRNano(**{**tiny_kwargs, "num_classes": 2, "num_queries": 6, "num_select": 6,
                           "positional_encoding_size": 8})
    fitted = fit_weights(checkpoint, target.model)
    assert fitted["class_embed.bias"].shape == (3,)
    assert fitted[POSITION_KEY].shape == (1, 65, 48)
    for key, value in before.items():
        assert torch.equal(checkpoint.weights[key], value), key


def test_plain_model_weights_win_over_the_prefixed_copy(tiny_kwargs, tmp_path):
    """Best/EMA `.pth` files hold both; `model` carries the weights that were selected."""
    ema, regular = tiny(tiny_kwargs, seed=1), tiny(tiny_kwargs, seed=2)
    state = {"model." + k: v for k, v in regular.model.state_dict().items()}
    torch.save({"model": ema.model.state_dict(), "state_dict": state, "model_config": {}}, tmp_path / "best.pth")
    loaded = load(tiny_kwargs, tmp_path / "best.pth")
    for got, want in zip(outputs(loaded), outputs(ema)):
        assert torch.equal(got, want)
