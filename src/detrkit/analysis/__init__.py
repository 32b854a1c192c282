"""Looking at results: plots of a run and of an evaluation (matplotlib, headless)."""
