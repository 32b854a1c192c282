"""evaluate() on segmentation and keypoint models: their metrics as validation names them, box analysis and plots."""

from tiny_config import TINY

from detrkit.variants import RFDETRSegNano


def test_segmentation_model_evaluates_with_mask_metrics(shapes_dir, tmp_path):
    model = RFDETRSegNano(**{**TINY, "patch_size": 16, "num_windows": 2})
    result = model.evaluate(shapes_dir, batch_size=2, num_workers=0, output_dir=str(tmp_path))
    assert {"segm_mAP_50_95", "segm_mAP_50", "segm_mAP_75", "segm_mAR", "mAP_50_95"} <= set(result.metrics)
    assert "masks" in result.detections[0]
    assert result.stats.images == 4 and sum(result.errors.counts.values()) > 0
    assert len(result.plots) == 6 and all(path.is_file() for path in result.plots)


def test_keypoint_model_evaluates_and_draws_its_skeleton(tmp_path):
    import torch

    from detrkit.datasets.synthetic import make_synthetic_dataset
    from detrkit.variants import RFDETRKeypointPreview

    data = make_synthetic_dataset(tmp_path / "pose", num_train=2, num_valid=2, image_size=(64, 64), seed=0,
                                  keypoints=True)
    torch.manual_seed(0)
    model = RFDETRKeypointPreview(**{**{k: v for k, v in TINY.items() if k != "num_classes"}, "patch_size": 16,
                                     "num_windows": 2, "use_grouppose_keypoints": True, "dual_projector": True,
                                     "dual_projector_kp_only": True, "num_keypoints_per_class": [4, 4, 4]})
    result = model.evaluate(data, batch_size=2, num_workers=0, output_dir=str(tmp_path / "out"), threshold=0.0)
    assert result.detections[0]["keypoints"].shape[-2:] == (4, 3) and result.truth[0]["keypoints"].shape[-2:] == (4, 3)
    corners = [(0, 1), (1, 2), (2, 3), (3, 0)]  # the demo's CORNER_SKELETON, from 0
    assert result.keypoint_skeletons == [corners] * 3
    assert {path.name for path in result.plots} >= {"gallery.png", "worst_images.png"}
