"""Every published variant, detection, segmentation and keypoint, builds with exactly the published checkpoint's
tensor names and shapes."""

from pathlib import Path

import pytest
import torch

from detrkit.models.build import build_model
from detrkit.variants import VARIANTS

TABLES = Path(__file__).parent.parent / "data" / "state_dicts"
PARAMETER_COUNTS = {
    "nano": 30_467_298, "small": 32_111_170, "medium": 33_687_458, "large": 33_933_218,
    "seg-nano": 33_577_475, "seg-small": 33_711_107, "seg-medium": 35_694_259, "seg-large": 35_873_971,
    "seg-xlarge": 38_113_635, "seg-2xlarge": 38_648_163, "keypoint-preview": 41_044_470,
}


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


def test_segmentation_head_starts_at_pytorch_defaults_with_zero_bias():
    model = build_model(VARIANTS["seg-nano"].config_class(pretrain_weights=None, device="cpu"))
    head = model.segmentation_head
    assert len(head.blocks) == 4 and torch.equal(head.bias, torch.zeros(1))
    assert torch.equal(head.blocks[0].norm.weight, torch.ones(256)) and head.blocks[0].norm.eps == 1e-6
    assert head.query_features_block.norm_in.eps == 1e-5
    bound = 1 / 256**0.5  # kaiming-uniform default of a 256-input Linear
    assert head.query_features_proj.weight.abs().max() <= bound
    assert head.query_features_proj.weight.std() > bound / 3
    assert build_model(VARIANTS["nano"].config_class(pretrain_weights=None, device="cpu")).segmentation_head is None


def test_keypoint_heads_and_queries_start_as_the_spec_says():
    model = build_model(VARIANTS["keypoint-preview"].config_class(pretrain_weights=None, device="cpu"))
    transformer = model.transformer
    assert torch.equal(model._kp_active_mask, torch.ones(1, 17, dtype=torch.bool))
    assert not transformer.decoder.keypoint_class_mask.any()  # one keypoint class: nothing blocked
    for head in (model.keypoint_embed, *transformer.enc_out_keypoint_embed):
        assert head.layers[-1].weight.abs().sum() == 0 and head.layers[-1].bias.abs().sum() == 0
    assert len(transformer.enc_out_keypoint_embed) == 13
    assert torch.equal(transformer.enc_out_keypoint_embed[0].layers[0].weight, model.keypoint_embed.layers[0].weight)
    for layer in transformer.decoder.layers:
        assert torch.equal(layer.instance_kp_layer_scale, torch.full((1,), 1e-6))
    bound = (6 / (17 + 256)) ** 0.5  # xavier-uniform of a (17, 256) table
    for table in (transformer.decoder.keypoint_pos_embed, transformer.keypoint_query_initializer.queries,
                  transformer.keypoint_query_initializer_enc.queries):
        assert table.abs().max() <= bound and table.std() > bound / 3
    modulation = transformer.keypoint_query_initializer.adaLN_modulation
    assert modulation[2].weight.abs().max() <= (6 / (256 + 768)) ** 0.5 and modulation[2].weight.std() > 0
    assert torch.equal(modulation[2].bias, torch.zeros(768))
