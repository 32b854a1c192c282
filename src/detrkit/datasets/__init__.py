"""Data: dataset readers, image conversion and transforms."""
