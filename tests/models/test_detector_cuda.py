"""The detector on CUDA gives the CPU's outputs and gradients (fp32 with TF32 off): tiny, tiny with masks, Nano."""

import pytest
import torch

from detrkit.config import ModelConfig
from detrkit.models.build import build_model
from detrkit.variants import RFDETRNanoConfig

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def strict_fp32():
    """TF32 products would differ from the CPU's by about 1e-3; the comparison wants fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def perturbed(config: ModelConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(config)
    with torch.no_grad():  # no zero-initialised layer may hide a difference
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def outputs_and_grads(model: torch.nn.Module, pixels: torch.Tensor) -> tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    out = model(pixels)
    # a scalar touching every output: logits and boxes of the last, auxiliary and encoder layers
    total = out.pred_logits.sum() + out.pred_boxes.sum() + out.enc_outputs.pred_boxes.sum()
    total = total + sum(aux.pred_boxes.sum() for aux in out.aux_outputs)
    total.backward()
    values = {"logits": out.pred_logits, "boxes": out.pred_boxes, "enc_logits": out.enc_outputs.pred_logits,
              "enc_boxes": out.enc_outputs.pred_boxes}
    # copies: moving the module later moves its .grad tensors in place
    grads = {name: p.grad.to("cpu", copy=True) for name, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach().to("cpu", copy=True) for k, v in values.items()}, grads


def test_tiny_training_step_matches_cpu(tiny_kwargs):
    model = perturbed(ModelConfig(**tiny_kwargs)).train()
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    cpu_out, cpu_grads = outputs_and_grads(model, pixels)
    cuda_out, cuda_grads = outputs_and_grads(model.cuda(), pixels.cuda())
    for name in cpu_out:
        torch.testing.assert_close(cuda_out[name], cpu_out[name], atol=2e-4, rtol=1e-3, msg=name)
    assert cuda_grads.keys() == cpu_grads.keys() and len(cpu_grads) > 50
    for name in cpu_grads:
        scale = cpu_grads[name].abs().max().clamp_min(1e-3)
        torch.testing.assert_close(cuda_grads[name] / scale, cpu_grads[name] / scale, atol=2e-3, rtol=0, msg=name)


def test_nano_inference_matches_cpu():
    model = perturbed(RFDETRNanoConfig(pretrain_weights=None, device="cpu", resolution=320)).eval()
    pixels = torch.randn(2, 3, 320, 320, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cpu_levels = model.backbone[0](pixels).levels
        cpu = model(pixels)
        model.cuda()
        gpu_levels = model.backbone[0](pixels.cuda()).levels
        gpu = model(pixels.cuda())
    for cpu_level, gpu_level in zip(cpu_levels, gpu_levels, strict=True):
        torch.testing.assert_close(gpu_level.cpu(), cpu_level, atol=1e-3, rtol=1e-3)
    # two-stage top-k may order near-tied proposals differently: nearly every query row must agree
    rows = torch.cat((gpu.pred_boxes.cpu() - cpu.pred_boxes, (gpu.pred_logits.cpu() - cpu.pred_logits) / 10), -1)
    agree = (rows.abs().amax(-1) < 2e-3).float().mean()
    assert agree > 0.95, f"only {agree:.1%} of query rows agree"


def test_tiny_segmentation_masks_and_head_gradients_match_cpu(tiny_kwargs):
    model = perturbed(ModelConfig(**tiny_kwargs, segmentation_head=True)).train()
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    results = []
    for device in ("cpu", "cuda"):
        model.to(device).zero_grad(set_to_none=True)
        out = model(pixels.to(device))
        masks = [o.pred_masks.dense() for o in (out, *out.aux_outputs, out.enc_outputs)]
        sum(m.square().mean() for m in masks).backward()
        grads = {n: p.grad.to("cpu", copy=True) for n, p in model.segmentation_head.named_parameters()}
        results.append(([m.detach().cpu() for m in masks], grads))
    (cpu_masks, cpu_grads), (cuda_masks, cuda_grads) = results
    for cpu_mask, cuda_mask in zip(cpu_masks, cuda_masks, strict=True):
        torch.testing.assert_close(cuda_mask, cpu_mask, atol=2e-4, rtol=1e-3)
    for name, grad in cpu_grads.items():
        scale = grad.abs().max().clamp_min(1e-3)
        torch.testing.assert_close(cuda_grads[name] / scale, grad / scale, atol=2e-3, rtol=0, msg=name)
