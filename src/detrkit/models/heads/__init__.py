"""Prediction heads applied to decoder outputs."""
