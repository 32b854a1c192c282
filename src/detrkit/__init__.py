"""detrkit: train and run real-time detection transformers of the RF-DETR family.

Importing the package is light: model classes load torch, never Lightning.
"""

from detrkit.detr import RFDETR, from_checkpoint
from detrkit.variants import RFDETRLarge, RFDETRMedium, RFDETRNano, RFDETRSmall

__all__ = ["RFDETR", "RFDETRLarge", "RFDETRMedium", "RFDETRNano", "RFDETRSmall", "from_checkpoint"]
__version__ = "0.1.0"
