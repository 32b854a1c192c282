"""Every published variant builds with exactly the published checkpoint's tensor names and shapes."""

from pathlib import Path

import pytest
import torch

from detrkit.models.build import build_model
from detrkit.variants import VARIANTS

TABLES = Path(__file__).parent.parent / "data" / "state_dicts"
PARAMETER_COUNTS = {"nano": 30_467_298, "small": 32_111_170, "medium": 33_687_458, "large": 33_933_218}


def published_entries(variant: str) -> list[tuple[str, list[int], str]]:
    rows = (TABLES / f"state_dict_{variant}.tsv").read_text().splitlines()[1:]
    return [(name, eval(shape), dtype) for name, shape, dtype, _ in (r.split("\t") for r in rows)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_state_dict_equals_published_table(variant):
    config = VARIANTS[variant].config_class(pretrain_weights=None, device="cpu")
    model = build_model(config)
    state = model.state_dict()
    got = [(name, list(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()]
    assert got == published_entries(variant)
    assert sum(p.numel() for p in model.parameters()) == PARAMETER_COUNTS[variant]


def test_head_initialisation_follows_spec():
    config = VARIANTS["nano"].config_class(pretrain_weights=None, device="cpu")
    model = build_model(config)
    assert torch.allclose(model.class_embed.bias, torch.full((91,), -4.59512), atol=1e-4)
    assert model.bbox_embed.layers[-1].weight.abs().sum() == 0
    assert model.refpoint_embed.weight.abs().sum() == 0
    for copy in model.transformer.enc_out_class_embed:
        assert torch.equal(copy.weight, model.class_embed.weight)
        assert copy.weight.data_ptr() != model.class_embed.weight.data_ptr()
    vit = model.backbone[0].encoder.encoder
    assert torch.equal(vit.embeddings.mask_token, torch.zeros(1, 384))
    assert torch.equal(vit.encoder.layer[0].layer_scale1.lambda1, torch.ones(384))
