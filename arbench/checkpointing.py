"""``LatestCheckpoint``: Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` follows every
validation.

Lightning 2.6 writes ``last.ckpt`` at a validation only when that validation also saved a
top-k checkpoint, i.e. when the monitored metric improved. A run whose later validations did
not improve kept a ``last.ckpt`` from its best step, so ``--ckpt_path last`` after a kill
retrained from there, and ``best:<study>`` references (the last checkpoint of a finished run)
named the best step's model, not the run's end. Here ``last.ckpt`` is written after every
validation (and the best checkpoints as before).
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class LatestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that also saves ``last.ckpt`` (with ``save_last``) at every
    validation whose step has not been saved yet."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)
                and not self._should_save_on_train_epoch_end(trainer)
                and self._last_global_step_saved != trainer.global_step):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
