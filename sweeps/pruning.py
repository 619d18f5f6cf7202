"""Pruning a trial at every validation of its Lightning run, within its bracket on a grid.

Pruning a trial from inside its Lightning run, at every validation (not once per epoch),
against the trials of its own bracket on a grid (:class:`BracketPruner`).
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

from sweeps.trials import LR, beyond_grid, point_key

BRACKET_FREE = (LR,)
"""The param a bracket varies: its trials share every other grid value (point and seed)."""


def bracket_key(params: dict) -> tuple:
    """The bracket of a trial with ``params``: its grid values less the lr."""
    return point_key(params, free=BRACKET_FREE)


class _BracketView:
    """The study as a pruner sees it, holding only the trials of one bracket, less failed
    trials: a failed trial's run is either retried (its retry stands for it) or not a result."""

    def __init__(self, study: optuna.Study, key: tuple):
        self._study, self._key = study, key

    def get_trials(self, deepcopy: bool = True, states=None) -> list:
        return [t for t in self._study.get_trials(deepcopy=deepcopy, states=states)
                if t.params and bracket_key(t.params) == self._key
                and t.state != optuna.trial.TrialState.FAIL]

    def __getattr__(self, name: str):
        return getattr(self._study, name)


class BracketPruner(optuna.pruners.BasePruner):
    """``base`` deciding as if the study held only the trials of the same grid point and seed
    (the point's lr sub-grid for one seed): on a grid, runs of another point (another p, or
    method) never stop this one. Successive halving over the lr sub-grid is then the
    protocol's cost rule, which ``sweeps.halving`` replays on finished grids."""

    def __init__(self, base: optuna.pruners.BasePruner, grid_lrs: Sequence[float] | None = None):
        self.base = base
        self.grid_lrs = None if grid_lrs is None else [float(lr) for lr in grid_lrs]

    def widened(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether ``trial`` runs an lr beyond the spec's sub-grid (``sweeps.widen``): that run
        tests whether an edge lr is the best, so it runs its whole budget. Under halving it
        would otherwise meet runs that are already finished at every rung, and a lower lr,
        slower to start, would be stopped at the first."""
        return beyond_grid(trial.params.get(LR), self.grid_lrs)

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self.widened(trial):
            return False
        return self.base.prune(_BracketView(study, bracket_key(trial.params)), trial)


def before_checkpoints(callbacks: list[Callback], callback: Callback) -> None:
    """Insert ``callback`` before the first checkpoint callback of ``callbacks`` (in place; at
    the end when there is none). For the pruning callback: a validation's value reaches the
    study before that step's ``last.ckpt`` exists, so a run killed in between and resumed from
    the checkpoint (where Lightning does not validate again) cannot pass a rung unjudged."""
    at = next((i for i, c in enumerate(callbacks) if isinstance(c, ModelCheckpoint)),
              len(callbacks))
    callbacks.insert(at, callback)


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
