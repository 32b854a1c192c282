"""Acceleration applied around the model: precision now; compile and CUDA graphs later."""
