"""Validate on the final epoch too when eval_interval skips it (Lightning only validates on
multiples of check_val_every_n_epoch)."""

from __future__ import annotations

import pytorch_lightning as pl


class ValidateLastEpoch(pl.Callback):
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.max_epochs is not None and trainer.current_epoch == trainer.max_epochs - 1:
            trainer.check_val_every_n_epoch = 1
