"""Evaluation of a trained detector: evaluate()'s result object, error breakdown, plots (matplotlib, headless)."""
