"""Acceleration applied around the model: precision, FP8, compile and CUDA graphs, planned once per run."""
