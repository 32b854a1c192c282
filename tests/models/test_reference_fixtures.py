"""Published-layout checkpoints written by the reference RF-DETR reproduce its outputs.

Fixtures come from the reference's make_fixtures.py; point DETRKIT_REFERENCE_FIXTURES at its
output folder (one sub-folder per variant holding checkpoint.pth and io.pt) to run these.
"""

import os
from pathlib import Path

import pytest
import torch

from detrkit.models.postprocess import top_detections
from detrkit.variants import VARIANTS

FIXTURES = Path(os.environ.get("DETRKIT_REFERENCE_FIXTURES", "/nonexistent"))
TOLERANCE = 1e-4

pytestmark = pytest.mark.reference


def fixture_dir(variant: str) -> Path:
    folder = FIXTURES / variant
    if not (folder / "checkpoint.pth").is_file():
        pytest.skip(f"no reference fixtures for {variant} under {FIXTURES}")
    return folder


@pytest.mark.parametrize("variant", ["nano", "small", "medium", "large"])
def test_checkpoint_reproduces_reference_outputs(variant):
    folder = fixture_dir(variant)
    reference = torch.load(folder / "io.pt", weights_only=True)
    model = VARIANTS[variant](pretrain_weights=str(folder / "checkpoint.pth"), device="cpu")
    assert model.model_config.num_classes == reference["config"]["num_classes"]
    with torch.inference_mode():
        out = model.model(reference["image"])
        detections = top_detections(out.pred_logits, out.pred_boxes, torch.tensor([[480, 640]]),
                                    model.model_config.num_select)[0]
    for key in ("pred_logits", "pred_boxes"):
        difference = (out[key] - reference["outputs"][key]).abs().max().item()
        assert difference < TOLERANCE, f"{variant} {key} differs by {difference}"
    expected = reference["detections"][0]
    assert torch.equal(detections["labels"], expected["labels"])
    torch.testing.assert_close(detections["scores"], expected["scores"], atol=TOLERANCE, rtol=0)
    # boxes are in pixels of a 640x480 image: 1e-4 relative to the image size
    torch.testing.assert_close(detections["boxes"], expected["boxes"], atol=640 * TOLERANCE, rtol=0)
