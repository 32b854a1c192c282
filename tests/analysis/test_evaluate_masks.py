"""evaluate() on a segmentation model: mask metrics as validation names them, box analysis and plots."""

from tiny_config import TINY

from detrkit.variants import RFDETRSegNano


def test_segmentation_model_evaluates_with_mask_metrics(shapes_dir, tmp_path):
    model = RFDETRSegNano(**{**TINY, "patch_size": 16, "num_windows": 2})
    result = model.evaluate(shapes_dir, batch_size=2, num_workers=0, output_dir=str(tmp_path))
    assert {"segm_mAP_50_95", "segm_mAP_50", "segm_mAP_75", "segm_mAR", "mAP_50_95"} <= set(result.metrics)
    assert "masks" in result.detections[0]
    assert result.stats.images == 4 and sum(result.errors.counts.values()) > 0
    assert len(result.plots) == 6 and all(path.is_file() for path in result.plots)
