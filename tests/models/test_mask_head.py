"""Segmentation head: mask logits per output layer, against a naive twin; detection untouched."""

import pytest
import torch
import torch.nn.functional as F

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.models.heads.mask import SegmentationHead
from detrkit.structures import MaskFactors


@pytest.fixture
def segmenter(tiny_kwargs):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**tiny_kwargs, segmentation_head=True))
    with torch.no_grad():  # the zero mask bias and zero box layer may not hide a difference
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def naive_masks(head: SegmentationHead, level, hidden, enc_features, image_size):
    """Spec 8.1 written out with functional ops, one dot product per query and pixel."""
    size = (image_size[0] // head.downsample_ratio, image_size[1] // head.downsample_ratio)
    spatial = F.interpolate(level, size=size, mode="bilinear", align_corners=False)

    def logits(pixels, queries):
        pixels = F.conv2d(pixels, head.spatial_features_proj.weight, head.spatial_features_proj.bias)
        mlp = head.query_features_block
        x = F.layer_norm(queries, (queries.shape[-1],), mlp.norm_in.weight, mlp.norm_in.bias, 1e-5)
        x = queries + F.linear(F.gelu(F.linear(x, mlp.layers[0].weight, mlp.layers[0].bias)),
                               mlp.layers[2].weight, mlp.layers[2].bias)
        x = F.linear(x, head.query_features_proj.weight, head.query_features_proj.bias)
        return (pixels[:, None] * x[:, :, :, None, None]).sum(2) + head.bias  # (B, Q, h, w)

    encoder = logits(spatial, enc_features)
    layers = []
    for block, queries in zip(head.blocks, hidden):
        y = F.conv2d(spatial, block.dwconv.weight, block.dwconv.bias, padding=1, groups=spatial.shape[1])
        y = F.layer_norm(y.permute(0, 2, 3, 1), (y.shape[1],), block.norm.weight, block.norm.bias, 1e-6)
        spatial = spatial + F.gelu(F.linear(y, block.pwconv1.weight, block.pwconv1.bias)).permute(0, 3, 1, 2)
        layers.append(logits(spatial, queries))
    return layers, encoder


def test_eval_masks_have_input_over_ratio_size_in_every_output(segmenter):
    with torch.no_grad():
        out = segmenter.eval()(torch.randn(2, 3, 64, 128), every_mask_layer=True)
    assert out["pred_masks"].shape == (2, 12, 16, 32)
    assert [aux["pred_masks"].dense().shape for aux in out.aux_outputs] == [(2, 12, 16, 32)]
    assert out.enc_outputs["pred_masks"].dense().shape == (2, 12, 16, 32)
    assert set(out) == {"pred_logits", "pred_boxes", "pred_masks", "aux_outputs", "enc_outputs"}


def test_eval_computes_only_the_final_layers_masks_unless_asked(segmenter):
    """What predictions and metrics read: the final layer's dense masks, the same values; the
    auxiliary layers' and proposals' masks (losses only) are skipped, projections included."""
    pixels = torch.randn(2, 3, 64, 64)
    projected = []
    segmenter.segmentation_head.query_features_proj.register_forward_hook(lambda m, a, out: projected.append(out))
    with torch.no_grad():
        every = segmenter.eval()(pixels, every_mask_layer=True)
        calls = len(projected)
        final = segmenter(pixels)
    assert calls == 3 and len(projected) == calls + 1  # 2 decoder layers and the proposals, then the final layer
    assert torch.equal(final.pred_masks, every.pred_masks)
    assert "pred_masks" not in final.aux_outputs[0] and "pred_masks" not in final.enc_outputs
    assert torch.equal(final.pred_logits, every.pred_logits)
    head = segmenter.segmentation_head
    level, hidden, enc = torch.randn(2, 32, 4, 6), torch.randn(2, 2, 5, 32), torch.randn(2, 7, 32)
    with torch.no_grad():
        layers, encoder = head(level, hidden, enc, (64, 96), every_layer=False)
        all_layers, _ = head(level, hidden, enc, (64, 96))
    assert layers[0] is None and encoder is None
    assert torch.equal(layers[1].dense(), all_layers[1].dense())


def test_mask_downsample_ratio_sets_the_mask_size(tiny_kwargs):
    model = build_model(ModelConfig(**tiny_kwargs, segmentation_head=True, mask_downsample_ratio=2)).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).pred_masks.shape == (1, 12, 32, 32)


def test_head_equals_naive_twin(segmenter):
    head = segmenter.segmentation_head
    torch.manual_seed(1)
    level, hidden, enc = torch.randn(2, 32, 4, 6), torch.randn(2, 2, 5, 32), torch.randn(2, 7, 32)
    with torch.no_grad():
        layers, encoder = head(level, hidden, enc, (64, 96))
        want_layers, want_encoder = naive_masks(head, level, hidden, enc, (64, 96))
    assert len(layers) == 2 and all(isinstance(f, MaskFactors) for f in layers)
    for got, want in zip(layers, want_layers):
        torch.testing.assert_close(got.dense(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(encoder.dense(), want_encoder, atol=1e-5, rtol=1e-5)


def test_detector_feeds_the_head_its_first_level_decoder_and_encoder_features(segmenter):
    """Masks of the detector equal the naive twin applied to the captured transformer outputs."""
    pixels = torch.randn(1, 3, 64, 64)
    seen = {}
    segmenter.backbone[0].register_forward_hook(lambda m, a, out: seen.update(level=out.levels[0]))
    segmenter.transformer.register_forward_hook(lambda m, a, out: seen.update(out=out))
    with torch.no_grad():
        out = segmenter.eval()(pixels, every_mask_layer=True)
        layers, encoder = naive_masks(segmenter.segmentation_head, seen["level"], seen["out"].hidden,
                                      seen["out"].enc_features, (64, 64))
    torch.testing.assert_close(out.pred_masks, layers[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.aux_outputs[0].pred_masks.dense(), layers[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.enc_outputs.pred_masks.dense(), encoder, atol=1e-5, rtol=1e-5)


def test_training_masks_are_factors_whose_group_zero_equals_eval(segmenter):
    pixels = torch.randn(2, 3, 64, 64)
    train = segmenter.train()(pixels)
    factors = train.pred_masks
    assert isinstance(factors, MaskFactors) and isinstance(train.enc_outputs.pred_masks, MaskFactors)
    assert factors.spatial.shape == (2, 32, 16, 16) and factors.queries.shape == (2, 36, 32)
    assert factors.bias is segmenter.segmentation_head.bias
    with torch.no_grad():
        evaluated = segmenter.eval()(pixels, every_mask_layer=True)
    torch.testing.assert_close(factors.dense()[:, :12], evaluated.pred_masks, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(train.aux_outputs[0].pred_masks.dense()[:, :12],
                               evaluated.aux_outputs[0].pred_masks.dense(), atol=1e-5, rtol=1e-5)


def test_every_head_parameter_gets_a_gradient_through_the_factors(segmenter):
    out = segmenter.train()(torch.randn(1, 3, 64, 64))
    loss = sum(o.pred_masks.dense().square().mean() for o in [out, *out.aux_outputs, out.enc_outputs])
    loss.backward()
    for name, param in segmenter.segmentation_head.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_segmentation_head_leaves_detection_outputs_unchanged(tiny_kwargs, segmenter):
    detector = build_model(ModelConfig(**tiny_kwargs))
    seg_keys = [k for k in segmenter.state_dict() if not k.startswith("segmentation_head.")]
    assert seg_keys == list(detector.state_dict())
    detector.load_state_dict({k: v for k, v in segmenter.state_dict().items() if k in seg_keys})
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        with_masks, plain = segmenter.eval()(pixels), detector.eval()(pixels)
    assert torch.equal(with_masks.pred_logits, plain.pred_logits)
    assert torch.equal(with_masks.enc_outputs.pred_boxes, plain.enc_outputs.pred_boxes)
    assert plain.pred_masks is None and "pred_masks" not in plain.aux_outputs[0]


def test_mask_factors_dense_is_the_dot_product_plus_bias():
    spatial, queries = torch.randn(2, 8, 3, 5), torch.randn(2, 4, 8)
    factors = MaskFactors(spatial, queries, torch.tensor([0.5]))
    want = torch.stack([torch.stack([(spatial[b] * queries[b, q][:, None, None]).sum(0) for q in range(4)])
                        for b in range(2)]) + 0.5
    torch.testing.assert_close(factors.dense(), want)
