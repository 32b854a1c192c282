"""Detector behaviour: group 0 equals eval, outputs as mappings, padding and non-square input."""

import pytest
import torch

from detrkit.config import ModelConfig
from detrkit.models.build import build_model


@pytest.fixture
def detector(tiny_kwargs):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**tiny_kwargs))
    with torch.no_grad():  # no zero-initialised layer may hide a difference
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_eval_outputs_shapes_and_mapping_access(detector):
    out = detector.eval()(torch.randn(2, 3, 64, 64))
    assert out["pred_logits"].shape == (2, 12, 6)
    assert out.pred_boxes.shape == (2, 12, 4)
    assert set(out) == {"pred_logits", "pred_boxes", "aux_outputs", "enc_outputs"}
    assert len(out["aux_outputs"]) == 1 and out["aux_outputs"][0]["pred_logits"].shape == (2, 12, 6)
    assert out["enc_outputs"]["pred_boxes"].shape == (2, 12, 4)
    with pytest.raises(KeyError, match="pred_masks"):
        out["pred_masks"]


def test_training_group_zero_equals_eval(detector):
    pixels = torch.randn(2, 3, 64, 64)
    train = detector.train()(pixels)
    assert train.pred_logits.shape == (2, 36, 6)
    assert train.enc_outputs.pred_logits.shape == (2, 36, 6)
    with torch.no_grad():
        evaluated = detector.eval()(pixels)
    # eval runs the packed-weight CPU path: equal up to float rounding
    torch.testing.assert_close(train.pred_logits[:, :12], evaluated.pred_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(train.pred_boxes[:, :12], evaluated.pred_boxes, atol=1e-5, rtol=1e-5)
    with torch.enable_grad():  # the plain path in both modes: bit-identical
        plain = detector.eval()(pixels)
    assert torch.equal(train.pred_logits[:, :12], plain.pred_logits)
    assert torch.equal(train.pred_boxes[:, :12], plain.pred_boxes)


def test_images_in_a_batch_are_independent(detector):
    detector.eval()
    pixels = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        batched = detector(pixels)
        alone = detector(pixels[1:2])
    torch.testing.assert_close(batched.pred_logits[1:2], alone.pred_logits, atol=1e-5, rtol=1e-5)


def test_padding_mask_changes_proposals_only_of_padded_image(detector):
    detector.eval()
    pixels = torch.randn(2, 3, 64, 96)
    padding = torch.zeros(2, 64, 96, dtype=torch.bool)
    padding[1, :, 64:] = True  # image 1 is 64x64 padded to 64x96
    with torch.no_grad():
        masked = detector(pixels, padding)
        plain = detector(pixels)
    torch.testing.assert_close(masked.pred_logits[0], plain.pred_logits[0])
    assert not torch.allclose(masked.pred_logits[1], plain.pred_logits[1])


def test_non_square_input_runs_with_resized_positions(detector):
    with torch.no_grad():
        out = detector.eval()(torch.randn(1, 3, 64, 128))
    assert out.pred_logits.shape == (1, 12, 6)
    assert torch.isfinite(out.pred_boxes).all()


def test_gradient_checkpointing_from_the_constructor_keeps_every_gradient(tiny_kwargs):
    """RFDETRNano(gradient_checkpointing=True) recomputes the ViT blocks in backward: the same loss
    and gradients (to 1e-6 in fp32), drop path included (its random draws are replayed)."""
    from detrkit import RFDETRNano
    from detrkit.losses.criterion import build_criterion
    from detrkit.config import TrainConfig
    from detrkit.structures import Target

    torch.manual_seed(0)
    plain = RFDETRNano(**tiny_kwargs)
    checkpointed = RFDETRNano(**tiny_kwargs, gradient_checkpointing=True)
    checkpointed.model.load_state_dict(plain.model.state_dict())
    assert checkpointed.model.backbone[0].encoder.encoder.gradient_checkpointing
    criterion = build_criterion(plain.model_config, TrainConfig(dataset_dir=None))
    pixels = torch.randn(2, 3, 64, 64)
    targets = [Target(torch.tensor([[0.4, 0.5, 0.3, 0.2]]), torch.tensor([2]), 0, (64, 64), (64, 64))] * 2
    results = []
    for model in (plain.model, checkpointed.model):
        model.train()
        for block in model.backbone[0].encoder.encoder.encoder.layer:
            block.drop_path.drop_prob = 0.2  # stochastic depth on, so the replayed random state matters
        torch.manual_seed(1)
        loss = criterion(model(pixels), targets, groups=model.groups).total
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=0)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 100
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=0, msg=name)
