"""Ready-made aug_config presets, each a plain dict that both augmentation backends can run.

Use one as it is (`model.train(..., aug_config=AUG_AGGRESSIVE)`) or copy and edit it. Every
preset uses only transforms that the Kornia backend also expresses, so the same preset gives
the same kind of augmentation on the CPU (Albumentations) and on the GPU (Kornia). The resize
and crop of the training pipeline run before these, as `scale_jitter` says.
"""

from __future__ import annotations

# Light touch for fine-tuning a pretrained model on a small, consistent data set: mirror images
# and small exposure changes only, nothing that moves boxes off the objects' pixels.
AUG_CONSERVATIVE: dict[str, dict] = {
    "HorizontalFlip": {"p": 0.5},
    "RandomBrightnessContrast": {"brightness_limit": 0.1, "contrast_limit": 0.1, "p": 0.3},
}

# Strong variety for larger data sets or long schedules: scale, shift, small rotations and
# shears (rotations stay small because rotated boxes grow around their objects), colour jitter,
# and rare blur, sensor noise and grayscale.
AUG_AGGRESSIVE: dict[str, dict] = {
    "HorizontalFlip": {"p": 0.5},
    "Affine": {"scale": (0.75, 1.25), "translate_percent": (-0.1, 0.1), "rotate": (-15, 15),
               "shear": (-5, 5), "p": 0.5},
    "ColorJitter": {"brightness": 0.3, "contrast": 0.3, "saturation": 0.3, "hue": 0.05, "p": 0.5},
    "GaussianBlur": {"sigma_limit": (0.1, 1.5), "p": 0.1},
    "GaussNoise": {"std_range": (0.02, 0.08), "p": 0.1},
    "ToGray": {"p": 0.05},
}

# Overhead imagery (drones, satellites) has no "up": every flip and right-angle turn is another
# real view, and turning by 90 degrees keeps boxes tight, unlike free rotation. Exposure varies
# with sun and sensor; haze and motion soften the image.
AUG_AERIAL: dict[str, dict] = {
    "HorizontalFlip": {"p": 0.5},
    "VerticalFlip": {"p": 0.5},
    "RandomRotate90": {"p": 0.5},
    "RandomBrightnessContrast": {"brightness_limit": 0.2, "contrast_limit": 0.2, "p": 0.5},
    "GaussianBlur": {"sigma_limit": (0.1, 1.0), "p": 0.1},
}

# Fixed cameras over parts or production lines: small placement angles, lighting drift, gamma
# of different cameras, sensor noise and slight defocus. No hue shifts or grayscale, because
# colour often is what tells a defect from a good part.
AUG_INDUSTRIAL: dict[str, dict] = {
    "HorizontalFlip": {"p": 0.5},
    "Rotate": {"limit": 10, "p": 0.3},
    "RandomBrightnessContrast": {"brightness_limit": 0.15, "contrast_limit": 0.15, "p": 0.5},
    "RandomGamma": {"gamma_limit": (85, 115), "p": 0.3},
    "GaussNoise": {"std_range": (0.01, 0.05), "p": 0.2},
    "GaussianBlur": {"sigma_limit": (0.1, 1.0), "p": 0.1},
}

PRESETS = {"conservative": AUG_CONSERVATIVE, "aggressive": AUG_AGGRESSIVE, "aerial": AUG_AERIAL,
           "industrial": AUG_INDUSTRIAL}
