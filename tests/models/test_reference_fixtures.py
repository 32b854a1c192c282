"""Published-layout checkpoints written by the reference RF-DETR reproduce its outputs.

Fixtures come from the reference's make_fixtures.py; point DETRKIT_REFERENCE_FIXTURES at its
output folder (one sub-folder per variant holding checkpoint.pth and io.pt) to run these.
"""

import itertools
import os
from pathlib import Path

import pytest
import torch

from detrkit.models.postprocess import top_detections
from detrkit.variants import VARIANTS

FIXTURES = Path(os.environ.get("DETRKIT_REFERENCE_FIXTURES", "/nonexistent"))
TOLERANCE = 1e-4
# Encoder scores closer than this are a tie in float32: which of the two proposals ranks first
# depends on rounding, and the order decides which learned query each one seeds.
TIE = 1e-5
SEGMENTATION = ["seg-nano", "seg-small", "seg-medium", "seg-large", "seg-xlarge", "seg-2xlarge"]
EXTRA_OUTPUTS = {"seg": {"pred_masks"}, "keypoint": {"pred_keypoints"}}

pytestmark = pytest.mark.reference


def fixture_dir(variant: str) -> Path:
    folder = FIXTURES / variant
    if not (folder / "checkpoint.pth").is_file():
        pytest.skip(f"no reference fixtures for {variant} under {FIXTURES}")
    return folder


def run_with_scores(detector, image, raised: dict[int, float]):
    """Eval outputs and the (Len,) encoder ranking scores, after raising the scores of the memory
    positions in `raised` by the given amounts."""
    seen = {}

    def hook(module, args, scores):
        if raised:
            scores = scores.clone()
            for position, amount in raised.items():
                scores[:, position] += amount
        seen["scores"] = scores[0].max(-1).values
        return scores

    handle = detector.transformer.enc_out_class_embed[0].register_forward_hook(hook)
    try:
        with torch.inference_mode():
            return detector(image), seen["scores"]
    finally:
        handle.remove()


def logits_difference(out, reference) -> float:
    return (out.pred_logits - reference["outputs"]["pred_logits"]).abs().max().item()


def reproduced_outputs(detector, reference):
    """The detector's outputs on the reference image; when they differ, the outputs with tied
    encoder proposals (within TIE, the k-th/k+1-th boundary included) ranked the other way,
    whichever ordering reproduces the reference."""
    out, scores = run_with_scores(detector, reference["image"], {})
    if logits_difference(out, reference) < TOLERANCE:
        return out
    values, positions = scores.topk(detector.num_queries + 1)
    # raising the later one of a tied pair just past the earlier one swaps them
    ties = [(positions[i + 1].item(), (values[i] - values[i + 1]).item() + TIE / 10)
            for i in range(detector.num_queries) if values[i] - values[i + 1] < TIE]
    for count in range(1, min(len(ties), 3) + 1):
        for flipped in itertools.combinations(ties, count):
            candidate = run_with_scores(detector, reference["image"], dict(flipped))[0]
            if logits_difference(candidate, reference) < TOLERANCE:
                return candidate
    return out


@pytest.mark.parametrize("variant", ["nano", "small", "medium", "large", *SEGMENTATION, "keypoint-preview"])
def test_checkpoint_reproduces_reference_outputs(variant):
    folder = fixture_dir(variant)
    reference = torch.load(folder / "io.pt", weights_only=True)
    model = VARIANTS[variant](pretrain_weights=str(folder / "checkpoint.pth"), device="cpu")
    assert model.model_config.num_classes == reference["config"]["num_classes"]
    out = reproduced_outputs(model.model, reference)
    extra = EXTRA_OUTPUTS.get(variant.split("-")[0], set())
    assert set(reference["outputs"]) == {"pred_logits", "pred_boxes"} | extra
    for key, expected in reference["outputs"].items():
        # mask logits reach tens: float32 rounding through the ViT grows with them
        tolerance = TOLERANCE * max(1.0, expected.abs().max().item()) if key == "pred_masks" else TOLERANCE
        difference = (out[key] - expected).abs().max().item()
        assert difference < tolerance, f"{variant} {key} differs by {difference}"
    detections = top_detections(out.pred_logits, out.pred_boxes, torch.tensor([[480, 640]]),
                                model.model_config.num_select)[0]
    expected = reference["detections"][0]
    assert torch.equal(detections["labels"], expected["labels"])
    if "keypoint" not in variant:  # keypoint models fuse keypoint uncertainty into the scores (spec 10.1)
        torch.testing.assert_close(detections["scores"], expected["scores"], atol=TOLERANCE, rtol=0)
    # boxes are in pixels of a 640x480 image: 1e-4 relative to the image size
    torch.testing.assert_close(detections["boxes"], expected["boxes"], atol=640 * TOLERANCE, rtol=0)
