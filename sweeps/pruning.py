"""Pruning a trial from inside its Lightning run, at every validation (not once per epoch)."""

from __future__ import annotations

import optuna
from lightning.pytorch import LightningModule, Trainer
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback


class StepPruningCallback(PyTorchLightningPruningCallback):
    """Optuna's Lightning pruning callback, reporting at ``trainer.global_step``.

    The stock callback reports at the epoch number, so with several validations per epoch
    (``val_check_interval`` in steps, as the profiles use) every report after the first in an
    epoch is dropped by Optuna. Here each validation is one report; the pruner then decides.
    Multi-process (DDP) runs keep the stock behaviour.
    """

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        score = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or self.is_ddp_backend or score is None:
            super().on_validation_end(trainer, pl_module)
            return
        step = trainer.global_step
        self._trial.report(float(score), step=step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} ({self.monitor} = {float(score):.4f})")
