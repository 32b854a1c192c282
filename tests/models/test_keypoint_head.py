"""GroupPose keypoint branch: outputs, decoding against naive twins, the dual projector, and
what changes with the keypoint settings."""

import pytest
import torch
import torch.nn.functional as F

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.models.heads.keypoint import KeypointHead, active_keypoint_mask, keypoint_class_logits
from detrkit.models.keypoint_decoder import (
    ConditionalQueryInitializer,
    KeypointContext,
    KeypointDecoder,
    KeypointDecoderLayer,
)
from detrkit.models.weights import reset_keypoint_precision

KEYPOINTS = {"use_grouppose_keypoints": True, "dual_projector": True, "dual_projector_kp_only": True,
             "num_keypoints_per_class": [3]}


def perturbed(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(**kwargs))
    with torch.no_grad():  # no zero-initialised layer may hide a difference
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture
def keypointer(tiny_kwargs):
    return perturbed(**tiny_kwargs, **KEYPOINTS)


def test_every_output_layer_carries_keypoints(keypointer, tiny_kwargs):
    out = keypointer.eval()(torch.randn(2, 3, 64, 64))
    assert out["pred_keypoints"].shape == (2, 12, 3, 8)
    assert out.aux_outputs[0].pred_keypoints.shape == (2, 12, 3, 8)
    assert out.enc_outputs["pred_keypoints"].shape == (2, 12, 3, 8)
    assert set(out) == {"pred_logits", "pred_boxes", "pred_keypoints", "aux_outputs", "enc_outputs"}
    assert "pred_keypoints" not in perturbed(**tiny_kwargs).eval()(torch.randn(1, 3, 64, 64))


def test_training_group_zero_equals_eval(keypointer):
    pixels = torch.randn(2, 3, 64, 64)
    train = keypointer.train()(pixels)
    assert train.pred_keypoints.shape == (2, 36, 3, 8) and train.enc_outputs.pred_keypoints.shape == (2, 36, 3, 8)
    with torch.enable_grad():  # the plain path in both modes
        evaluated = keypointer.eval()(pixels)
    for got, want in ((train, evaluated), (train.aux_outputs[0], evaluated.aux_outputs[0]),
                      (train.enc_outputs, evaluated.enc_outputs)):
        torch.testing.assert_close(got.pred_keypoints[:, :12], want.pred_keypoints, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.pred_logits[:, :12], want.pred_logits, atol=1e-5, rtol=1e-5)


def test_keypoints_and_logits_equal_the_naive_decoding_of_the_transformer_outputs(keypointer):
    seen = {}
    keypointer.transformer.register_forward_hook(lambda m, a, out: seen.update(out=out))
    with torch.no_grad():
        out = keypointer.eval()(torch.randn(1, 3, 64, 64))
        states, boxes = seen["out"].keypoints[-1], seen["out"].reference  # (1, Q, K, D), (1, Q, 4)
        delta = keypointer.keypoint_embed(states)
        logits = keypointer.class_embed(seen["out"].hidden[-1])
    for q in range(12):
        for k in range(3):
            x = delta[0, q, k, 0] * boxes[0, q, 2] + boxes[0, q, 0]
            y = delta[0, q, k, 1] * boxes[0, q, 3] + boxes[0, q, 1]
            want = torch.cat((torch.stack((x, y)), delta[0, q, k, 2:]))
            torch.testing.assert_close(out.pred_keypoints[0, q, k], want)
    logits[..., 0] += delta[..., 7].sum(-1)  # the single keypoint class raises logit 0 only
    torch.testing.assert_close(out.pred_logits, logits, atol=1e-5, rtol=1e-5)


def test_keypoints_cross_attend_the_second_projector_only(keypointer):
    pixels = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = keypointer.eval()(pixels)
        for p in keypointer.backbone[0].cross_attn_projector.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        after = keypointer(pixels)
    assert torch.equal(after.enc_outputs.pred_boxes, before.enc_outputs.pred_boxes)
    assert torch.equal(after.aux_outputs[0].pred_boxes, before.aux_outputs[0].pred_boxes)  # same references
    assert (after.pred_keypoints - before.pred_keypoints).abs().max() > 1e-3


def test_without_dual_projector_keypoints_read_the_main_memory(tiny_kwargs):
    model = perturbed(**tiny_kwargs, **dict(KEYPOINTS, dual_projector=False)).eval()
    assert model.backbone[0].cross_attn_projector is None
    assert model(torch.randn(1, 3, 64, 64)).pred_keypoints.shape == (1, 12, 3, 8)


def test_images_in_a_batch_are_independent_with_padding(keypointer):
    keypointer.eval()
    pixels = torch.randn(2, 3, 64, 96)
    padding = torch.zeros(2, 64, 96, dtype=torch.bool)
    padding[1, :, 64:] = True
    with torch.no_grad():
        batched = keypointer(pixels, padding)
        alone = keypointer(pixels[:1], padding[:1])
    torch.testing.assert_close(batched.pred_keypoints[:1], alone.pred_keypoints, atol=1e-5, rtol=1e-5)


def test_training_gradients_reach_every_keypoint_parameter(keypointer):
    out = keypointer.train()(torch.randn(1, 3, 64, 64))
    loss = out.pred_keypoints.sum() + out.aux_outputs[0].pred_keypoints.sum() + out.enc_outputs.pred_keypoints.sum()
    (loss + out.pred_logits.sum()).backward()  # the last layer's instance update reaches the logits only
    names = [n for n, p in keypointer.named_parameters() if "kp" in n or "keypoint" in n or "cross_attn_projector" in n]
    assert len(names) > 40
    assert [n for n in names if keypointer.get_parameter(n).grad is None] == []


def test_head_decodes_and_pads_several_keypoint_classes():
    head = KeypointHead(16, [2, 3])
    states, boxes = torch.randn(4, 5, 16), torch.rand(4, 4) + 0.1  # (Q, K compact, D), (Q, 4)
    padded = head.predict(states, boxes)
    assert padded.shape == (4, 6, 8)
    delta = head(states)
    decoded = torch.cat((delta[..., :2] * boxes[:, None, 2:] + boxes[:, None, :2], delta[..., 2:]), -1)
    slots = [0, 1, 3, 4, 5]  # class 0 owns slots 0..2 (uses 2), class 1 slots 3..5
    for compact, slot in enumerate(slots):
        torch.testing.assert_close(padded[:, slot], decoded[:, compact])
    assert torch.equal(padded[:, 2], torch.zeros(4, 8))


def test_non_finite_deltas_decode_as_zero():
    head = KeypointHead(8, [1])
    with torch.no_grad():
        head.layers[-1].bias.copy_(torch.tensor([float("nan"), float("inf"), 1, 1, 1, 1, 1, -float("inf")]))
    keypoints = head.predict(torch.zeros(1, 1, 8), torch.tensor([[0.5, 0.5, 0.2, 0.2]]))
    assert torch.equal(keypoints[0, 0], torch.tensor([0.5, 0.5, 1, 1, 1, 1, 1, 0]))


def test_class_logits_sum_each_class_over_its_active_keypoints():
    active = active_keypoint_mask([2, 3])
    assert active.tolist() == [[True, True, False], [True, True, True]]
    keypoints = torch.randn(2, 7, 6, 8)
    boost = keypoint_class_logits(keypoints, active, 5)
    assert boost.shape == (2, 7, 5)
    torch.testing.assert_close(boost[..., 0], keypoints[..., 0, 7] + keypoints[..., 1, 7])
    torch.testing.assert_close(boost[..., 1], keypoints[..., 3:6, 7].sum(-1))
    assert torch.equal(boost[..., 2:], torch.zeros(2, 7, 3))


def test_conditional_queries_follow_the_adaln_formula():
    torch.manual_seed(0)
    init = ConditionalQueryInitializer(8, 3, 4)
    with torch.no_grad():
        for p in init.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    condition = torch.randn(2, 5, 8)
    out = init(condition)
    assert out.shape == (2, 5, 3, 4)
    first, second = init.adaLN_modulation[0], init.adaLN_modulation[2]
    scale, shift, gate = second(F.gelu(first(condition[1, 2]))).split(4)
    queries = init.queries
    normed = (queries - queries.mean(-1, keepdim=True)) / (queries.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    want = init.out_proj(normed * (1 + scale) + shift) * gate + queries
    torch.testing.assert_close(out[1, 2], want, atol=1e-5, rtol=1e-5)


def test_keypoints_of_one_class_do_not_attend_another_class():
    torch.manual_seed(0)
    decoder = KeypointDecoder(KeypointDecoderLayer(16, 2, 2, 1, 2, 32), 1, [2, 3])
    assert decoder.keypoint_class_mask.int().tolist()[1:3] == [[0, 0, 0, 1, 1, 1]] * 2
    layer = decoder.layers[0]
    mask = torch.zeros(6, 6).masked_fill(decoder.keypoint_class_mask, float("-inf"))
    context = KeypointContext(torch.randn(1, 4, 16), decoder.keypoint_pos_embed, mask)
    keypoints = torch.randn(1, 3, 5, 16)
    changed = keypoints.clone()
    changed[:, :, 2:] += 1.0  # the class-1 keypoints
    tgt = torch.randn(1, 3, 16)
    _, before = layer._instance_attention(tgt, keypoints, context)
    _, after = layer._instance_attention(tgt, changed, context)
    torch.testing.assert_close(after[:, :, :2], before[:, :, :2])
    assert (after[:, :, 2:] - before[:, :, 2:]).abs().max() > 0.1


def test_several_keypoint_classes_run_end_to_end(tiny_kwargs):
    model = perturbed(**tiny_kwargs, **dict(KEYPOINTS, num_keypoints_per_class=[2, 3])).eval()
    assert model._kp_active_mask.shape == (2, 3)
    assert model(torch.randn(1, 3, 64, 64)).pred_keypoints.shape == (1, 12, 6, 8)


@pytest.mark.parametrize("changes, present, absent", [
    ({"grouppose_keypoint_dim_downscale": 2}, ["layers.0.inst_in_proj.weight", "layers.0.memory_in_proj.weight"], []),
    ({"keypoint_cross_attn": False}, [],
     ["layers.0.kp_cross_attn.value_proj.weight", "layers.0.kp_cross_attn_norm.weight"]),
    ({"inter_instance_kp_attn": True},
     ["layers.0.inter_inst_kp_attn.in_proj_weight", "layers.0.inter_inst_kp_norm.weight"], []),
])
def test_keypoint_settings_add_or_remove_their_modules(tiny_kwargs, changes, present, absent):
    model = perturbed(**tiny_kwargs, **KEYPOINTS, **changes)
    keys = {k.removeprefix("transformer.decoder.") for k in model.state_dict()}
    assert set(present) <= keys and not set(absent) & keys
    width = 32 // changes.get("grouppose_keypoint_dim_downscale", 1)
    assert model.keypoint_embed.layers[0].weight.shape == (width, width)
    out = model.train()(torch.randn(1, 3, 64, 64))
    assert out.pred_keypoints.shape == (1, 36, 3, 8)
    out.pred_keypoints.sum().backward()


@pytest.mark.parametrize("changes, error, message", [
    ({"num_keypoints_per_class": []}, ValueError, "num_keypoints_per_class"),
    ({"num_keypoints_per_class": [1] * 6}, ValueError, "num_classes=5"),
    ({"dual_projector_kp_only": False}, NotImplementedError, "dual_projector_kp_only"),
    ({"use_grouppose_keypoints": False}, NotImplementedError, "dual_projector"),
])
def test_inconsistent_keypoint_settings_raise(tiny_kwargs, changes, error, message):
    with pytest.raises(error, match=message):
        build_model(ModelConfig(**tiny_kwargs, **dict(KEYPOINTS, **changes)))


def test_reset_keypoint_precision_zeroes_rows_4_to_6_of_every_keypoint_head(keypointer, tiny_kwargs):
    heads = [keypointer.keypoint_embed, *keypointer.transformer.enc_out_keypoint_embed]
    before = [(h.layers[-1].weight.clone(), h.layers[-1].bias.clone()) for h in heads]
    first_layers = keypointer.keypoint_embed.layers[0].weight.clone()
    reset_keypoint_precision(keypointer)
    for head, (weight, bias) in zip(heads, before):
        last = head.layers[-1]
        assert torch.equal(last.weight[4:7], torch.zeros(3, 32)) and torch.equal(last.bias[4:7], torch.zeros(3))
        keep = [0, 1, 2, 3, 7]
        assert torch.equal(last.weight[keep], weight[keep]) and torch.equal(last.bias[keep], bias[keep])
    assert torch.equal(keypointer.keypoint_embed.layers[0].weight, first_layers)
    detector = perturbed(**tiny_kwargs)
    state = {k: v.clone() for k, v in detector.state_dict().items()}
    reset_keypoint_precision(detector)  # no keypoint heads: nothing changes
    assert all(torch.equal(v, state[k]) for k, v in detector.state_dict().items())


def test_keypoint_ffn_in_row_chunks_equals_the_plain_layers():
    torch.manual_seed(0)
    layer = KeypointDecoderLayer(16, 2, 2, 1, 2, 32)
    x = torch.randn(2, 150, 17, 16, requires_grad=True)  # 5100 rows: chunked on CPU under autograd
    chunked = layer._keypoint_ffn(x)
    plain = layer.kp_linear3.forward(F.relu(F.linear(x, layer.kp_linear1.weight, layer.kp_linear1.bias)))
    torch.testing.assert_close(chunked, plain, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(chunked)
    (chunked_grad,) = torch.autograd.grad(chunked, x, grad)
    (plain_grad,) = torch.autograd.grad(plain, x, grad)
    torch.testing.assert_close(chunked_grad, plain_grad, atol=1e-5, rtol=1e-5)
