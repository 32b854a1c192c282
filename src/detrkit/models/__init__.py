"""Detector networks, their builders and checkpoint handling."""
