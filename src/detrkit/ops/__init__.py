"""Pure tensor math shared by models, losses and evaluation."""
