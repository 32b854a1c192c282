"""Export detectors to ONNX and OpenVINO with an accuracy check, and predict with exported files."""

from detrkit.export.check import CheckReport, ExportAccuracyError
from detrkit.export.runtime import ExportedModel, load_exported

__all__ = ["CheckReport", "ExportAccuracyError", "ExportedModel", "load_exported"]
