"""``LatestCheckpoint``: Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` follows every
validation; and the global random states a checkpoint keeps (:func:`rng_states`).

Lightning 2.6 writes ``last.ckpt`` at a validation only when that validation also saved a
top-k checkpoint, i.e. when the monitored metric improved. A run whose later validations did
not improve kept a ``last.ckpt`` from its best step, so ``--ckpt_path last`` after a kill
retrained from there, and ``best:<study>`` references (the last checkpoint of a finished run)
named the best step's model, not the run's end. Here ``last.ckpt`` is written after every
validation (and the best checkpoints as before).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

RNG_KEY = "arbench_rng_states"
"""The checkpoint entry that holds :func:`rng_states` (checkpoints before it have none)."""


def rng_states() -> dict[str, Any]:
    """The global random states a training step draws from (dropout masks): torch's CPU
    generator, and each CUDA device's where CUDA is initialised; tensors only, so a checkpoint
    still loads with ``weights_only=True``. (Training draws nothing from NumPy's or Python's
    global generators: the data are generated from their own seeds.)"""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Set the global random states :func:`rng_states` returned (a CUDA state only where this
    machine has as many devices)."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)


class LatestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that also saves ``last.ckpt`` (with ``save_last``) at every
    validation whose step has not been saved yet: at the validation, or, where Lightning saves
    at each epoch's end (validation once per epoch), there."""

    def _save_last_if_new(self, trainer: L.Trainer) -> None:
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and self._last_global_step_saved != trainer.global_step):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_new(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_new(trainer)
