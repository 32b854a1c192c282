"""Callbacks for what Lightning's own do not cover."""
