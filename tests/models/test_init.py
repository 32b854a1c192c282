"""Random initialisation of a detector built without pretrained weights (spec 2.5, 3, 5.6, 5.7, 6.2)."""

import math

import pytest
import torch
from torch import nn

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.models.deform_attn import MSDeformAttn


@pytest.fixture
def model(tiny_kwargs):
    torch.manual_seed(0)
    return build_model(ModelConfig(**tiny_kwargs))


def _xavier_bound(weight: torch.Tensor) -> float:
    fan_out, fan_in = weight.shape[0], weight[0].numel()
    return math.sqrt(6.0 / (fan_in + fan_out))


def _assert_uniform(weights: list[torch.Tensor], bound_of) -> None:
    """Every tensor lies in [-bound, bound] and has the mean 0 and std bound/sqrt(3) of U(-bound, bound),
    within 5 standard errors of the estimates."""
    for weight in weights:
        bound, n = bound_of(weight), weight.numel()
        std = bound / math.sqrt(3)
        assert weight.abs().max() <= bound + 1e-7
        if n >= 256:
            assert weight.abs().max() > 0.9 * bound
        assert weight.std().item() == pytest.approx(std, rel=5 * 0.45 / math.sqrt(n))
        assert abs(weight.mean().item()) < 5 * std / math.sqrt(n)


def _kaiming_bound(weight: torch.Tensor) -> float:
    """PyTorch's default Linear/Conv init: kaiming-uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), ...)."""
    return 1.0 / math.sqrt(weight[0].numel())


def test_transformer_weights_are_xavier_uniform(model):
    transformer = model.transformer
    weights = []
    for layer in transformer.decoder.layers:
        weights += [layer.self_attn.in_proj_weight, layer.self_attn.out_proj.weight,
                    layer.linear1.weight, layer.linear2.weight,
                    layer.cross_attn.value_proj.weight, layer.cross_attn.output_proj.weight]
    weights += [lin.weight for lin in transformer.decoder.ref_point_head.layers]
    weights += [lin.weight for lin in transformer.enc_output]
    _assert_uniform([w.detach() for w in weights], _xavier_bound)
    for layer in transformer.decoder.layers:
        assert not layer.self_attn.in_proj_bias.any() and not layer.self_attn.out_proj.bias.any()
    # the per-group encoder projections are drawn independently
    assert not torch.equal(transformer.enc_output[0].weight, transformer.enc_output[1].weight)


def test_decoder_layers_are_clones_of_one_layer(model):
    """As in the reference, layers are copies of one layer: weights re-drawn, FFN biases shared."""
    first, second = model.transformer.decoder.layers[:2]
    assert torch.equal(first.linear1.bias, second.linear1.bias)
    assert torch.equal(first.linear2.bias, second.linear2.bias)
    assert first.linear1.bias.data_ptr() != second.linear1.bias.data_ptr()
    assert not torch.equal(first.linear1.weight, second.linear1.weight)
    _assert_uniform([first.linear1.bias.detach()], lambda _: _kaiming_bound(first.linear1.weight))


def test_deformable_attention_init(model):
    modules = [m for m in model.modules() if isinstance(m, MSDeformAttn)]
    assert len(modules) == len(model.transformer.decoder.layers)
    for attn in modules:
        assert not attn.sampling_offsets.weight.any()
        assert not attn.attention_weights.weight.any() and not attn.attention_weights.bias.any()
        assert not attn.value_proj.bias.any() and not attn.output_proj.bias.any()
        bias = attn.sampling_offsets.bias.view(attn.heads, attn.levels, attn.points, 2)
        for head in range(attn.heads):
            angle = 2 * math.pi * head / attn.heads
            direction = torch.tensor([math.cos(angle), math.sin(angle)])
            direction = direction / direction.abs().max()
            for point in range(attn.points):
                expected = (direction * (point + 1)).expand(attn.levels, 2)
                torch.testing.assert_close(bias[head, :, point], expected)


def test_head_init(model):
    prior = -math.log((1 - 0.01) / 0.01)
    assert prior == pytest.approx(-4.5951, abs=1e-4)
    torch.testing.assert_close(model.class_embed.bias, torch.full_like(model.class_embed.bias, prior))
    _assert_uniform([model.class_embed.weight.detach()], _kaiming_bound)
    last = model.bbox_embed.layers[-1]
    assert not last.weight.any() and not last.bias.any()
    hidden = [layer.weight.detach() for layer in model.bbox_embed.layers[:-1]]
    _assert_uniform(hidden, _kaiming_bound)
    assert not model.refpoint_embed.weight.any()
    query = model.query_feat.weight.detach()
    assert query.std().item() == pytest.approx(1.0, rel=0.1) and abs(query.mean().item()) < 0.1


def test_encoder_heads_are_copies_of_the_main_heads(model):
    transformer = model.transformer
    assert len(transformer.enc_out_class_embed) == len(transformer.enc_out_bbox_embed) == model.groups
    main = {"class": model.class_embed.state_dict(), "bbox": model.bbox_embed.state_dict()}
    for kind, copies in (("class", transformer.enc_out_class_embed), ("bbox", transformer.enc_out_bbox_embed)):
        for head in copies:
            for name, value in head.state_dict().items():
                assert torch.equal(value, main[kind][name]), (kind, name)
                assert value.data_ptr() != main[kind][name].data_ptr()  # copies, not shared


def test_vit_init(model):
    vit = model.backbone[0].encoder.encoder
    weights = []
    for module in vit.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            weights.append(module.weight.detach().flatten())
            assert not module.bias.any()
        elif isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and not module.bias.any()
    weights = torch.cat(weights)
    assert weights.std().item() == pytest.approx(0.02, rel=0.05)
    assert abs(weights.mean().item()) < 1e-3
    embeddings = vit.embeddings
    tables = torch.cat((embeddings.position_embeddings.flatten(), embeddings.cls_token.flatten()))
    assert tables.std().item() == pytest.approx(0.02, rel=0.15)
    assert not torch.equal(embeddings.cls_token[0, 0], embeddings.position_embeddings[0, 0])
    assert not embeddings.mask_token.any()
    for block in vit.encoder.layer:
        assert torch.all(block.layer_scale1.lambda1 == 1.0) and torch.all(block.layer_scale2.lambda1 == 1.0)


def test_projector_init(model):
    projector = model.backbone[0].projector
    convs = [m.weight.detach() for m in projector.modules() if isinstance(m, nn.Conv2d)]
    assert convs
    _assert_uniform(convs, _kaiming_bound)
    norms = [m for name, m in projector.named_modules() if name.endswith("bn") or type(m).__name__ == "LayerNorm2d"]
    assert norms
    for norm in norms:
        assert torch.all(norm.weight == 1) and not norm.bias.any()
