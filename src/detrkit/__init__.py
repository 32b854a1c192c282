"""detrkit: train and run real-time detection transformers of the RF-DETR family.

Importing the package is light: model classes load torch, never Lightning.
"""

from detrkit.datasets.coco_categories import COCO_CATEGORIES, COCO_CLASS_NAMES
from detrkit.detr import RFDETR, from_checkpoint
from detrkit.variants import (
    RFDETRKeypointPreview, RFDETRLarge, RFDETRMedium, RFDETRNano, RFDETRSeg2XLarge, RFDETRSegLarge, RFDETRSegMedium,
    RFDETRSegNano, RFDETRSegSmall, RFDETRSegXLarge, RFDETRSmall,
)
from detrkit.version import __version__

__all__ = ["COCO_CATEGORIES", "COCO_CLASS_NAMES", "RFDETR", "RFDETRKeypointPreview", "RFDETRLarge", "RFDETRMedium",
           "RFDETRNano", "RFDETRSeg2XLarge", "RFDETRSegLarge", "RFDETRSegMedium", "RFDETRSegNano", "RFDETRSegSmall",
           "RFDETRSegXLarge", "RFDETRSmall", "__version__", "from_checkpoint"]
