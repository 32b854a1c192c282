"""The package version, in the foundation so that any layer may record it."""

__version__ = "0.1.0"
