"""Looking at results: evaluate()'s result object, error breakdown, plots of a run and of an evaluation (matplotlib, headless)."""
