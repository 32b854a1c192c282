"""Early stopping on the validation metric that ranks weights, with one log line per epoch.

Lightning's EarlyStopping does the counting (patience, min_delta, state in checkpoints, the stop
decision shared by all processes); this subclass picks the monitored value (the EMA track's, or
the better of the live and EMA tracks) and reports each check the way the docs show:

    epoch 12/50: val/mAP_50_95 = 0.455 (best: 0.455) - counter: 0 (improved)
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.utilities import rank_zero_info


class MetricEarlyStopping(EarlyStopping):
    def __init__(self, metric: str, patience: int = 10, min_delta: float = 0.001, use_ema: bool = False,
                 skip_epochs: int = 0) -> None:
        super().__init__(monitor=f"val/{metric}", mode="max", patience=patience, min_delta=min_delta,
                         check_on_train_epoch_end=False, verbose=False)
        self.metric, self.use_ema, self.skip_epochs = metric, use_ema, skip_epochs

    @property
    def state_key(self) -> str:
        return "EarlyStopping"

    def monitored(self, trainer: pl.Trainer) -> tuple[str, torch.Tensor] | None:
        """(description, value) of this epoch's monitored metric, or None before validation ran."""
        metrics = trainer.callback_metrics
        names = [f"val/ema_{self.metric}"]
        if not self.use_ema:
            names.insert(0, f"val/{self.metric}")
        present = [name for name in names if name in metrics]
        if not present:
            return None
        value = torch.stack([metrics[name].detach().float().cpu() for name in present]).max()
        label = present[0] if len(present) == 1 else f"max({', '.join(present)})"
        return label, value

    def _run_early_stopping_check(self, trainer: pl.Trainer) -> None:
        if trainer.current_epoch < self.skip_epochs:
            return
        monitored = self.monitored(trainer)
        if monitored is None:
            return
        label, current = monitored
        had_best = bool(torch.isfinite(self.best_score))
        should_stop, _ = self._evaluate_stopping_criteria(current)
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
        if self.wait_count == 0:
            note = " (improved)" if had_best else ""
        else:
            note = " (no improvement)" if self.wait_count == 1 else ""
        if should_stop:
            note += " → STOP"
        rank_zero_info(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: {label} = {float(current):.3f} "
                       f"(best: {float(self.best_score):.3f}) - counter: {self.wait_count}{note}")
