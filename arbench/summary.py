"""``RunSummary``: writes ``<log_dir>/summary.json`` after every validation and at fit end.

During ``fit`` the file is written after the checkpoint callbacks have saved (Lightning runs
them last in ``on_validation_end``): at the next training batch, at fit end, or when the run
stops on an exception or Ctrl-C. So ``best_checkpoint`` and ``last_checkpoint`` name files that
exist, not the ones of the validation before.

The file holds what sweeps and tables read back: the best and the last ``val/acc`` (best is the
objective), per-slice accuracies at the best validation, the same for zoology's per-example
accuracy ``val/example_acc`` (its own best validation, ``example_*`` keys), step, wall time,
state size, parameter count, hyperparameters and checkpoint paths, and ``stopped_by``: what
stopped this process's fit (``Ctrl-C``, ``SIGTERM`` or a crash's exception type; null while it
runs and once it finishes; a run stopped before its first validation writes no file). Written
atomically, so a crash never leaves it torn. The best and last validations and the wall time so
far travel in the checkpoint, so a run resumed after a kill reports over all its validations,
including those before the kill. So do the val/acc and training-loss curves behind the
``converged`` and ``collapsed_at`` verdicts (:mod:`arbench.curves`), and the ``val/example_acc``
curve (``example_curve``, for the sweep reports of studies judged by zoology's metric). A
``validate`` of a checkpoint writes its evaluation as the last validation and leaves the
training's curves, and so its verdicts, as the checkpoint carried them. The file keeps the
training loss as means over blocks of 25 steps (``loss_curve``,
:func:`arbench.curves.block_means`), so a sweep record carries it to another machine, where the
run's TensorBoard files are not.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from arbench.curves import block_means, collapse_step, is_converged
from arbench.files import atomic_write
from arbench.machine import device_name
from arbench.objective import EXAMPLE_ACC


def chance_loss(pl_module: L.LightningModule) -> float | None:
    """ln vocab (nats): the cross-entropy of a uniform guess; None when there is no vocab."""
    vocab = dict(getattr(pl_module, "hparams", None) or {}).get("vocab_size")
    return math.log(vocab) if vocab else None


def stop_cause(exception: BaseException) -> str:
    """What stopped a run, as its report and ``summary.json`` name it: ``Ctrl-C`` (a
    ``KeyboardInterrupt``), ``SIGTERM`` (Lightning's ``SIGTERMException``, from ``kill <pid>``)
    or the exception's type name (a crash)."""
    if isinstance(exception, KeyboardInterrupt):
        return "Ctrl-C"
    if isinstance(exception, SIGTERMException):
        return "SIGTERM"
    return type(exception).__name__


def write_json_atomic(path: Path, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path``, whole or not at all (:func:`atomic_write`)."""
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2, sort_keys=True)))


class RunSummary(Callback):
    """Keeps the best validation's metrics and writes them with the run's metadata."""

    def __init__(self, filename: str = "summary.json"):
        self.filename = filename
        self.best: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.best_example: dict[str, float] = {}  # the validation with the best example_acc
        self.start = time.time()
        self.earlier_s = 0.0  # wall time of the runs this one resumes, in seconds
        self.val_curve: list[tuple[int, float]] = []  # (step, val/acc)
        self.example_curve: list[tuple[int, float]] = []  # (step, val/example_acc)
        self.loss_curve: list[tuple[int, float]] = []  # (step, training loss), every step
        self._step_losses: list[float] = []  # the losses of this optimiser step's batches
        self._step_start = 0  # the global step when its first batch started
        self.pending = False  # a validation whose summary waits for the checkpoint callbacks
        self.log_dir: str | None = None
        self.stopped_by: str | None = None  # what stopped this process's fit (stop_cause)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.time()
        self.stopped_by = None
        self.log_dir = self._log_dir(trainer)  # every rank calls it here, once

    def wall_time_s(self) -> float:
        return self.earlier_s + time.time() - self.start

    def state_dict(self) -> dict:
        return {"best": dict(self.best), "last": dict(self.last),
                "best_example": dict(self.best_example), "wall_time_s": self.wall_time_s(),
                "val_curve": list(self.val_curve), "example_curve": list(self.example_curve),
                "loss_curve": list(self.loss_curve)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best = dict(state_dict.get("best", {}))
        self.last = dict(state_dict.get("last", {}))
        self.best_example = dict(state_dict.get("best_example", {}))
        self.earlier_s = float(state_dict.get("wall_time_s", 0.0))
        self.val_curve = [tuple(p) for p in state_dict.get("val_curve", [])]
        self.example_curve = [tuple(p) for p in state_dict.get("example_curve", [])]
        self.loss_curve = [tuple(p) for p in state_dict.get("loss_curve", [])]

    def converged(self) -> bool | None:
        """The convergence verdict of the val/acc curve so far (:func:`is_converged`)."""
        return is_converged(self.val_curve)

    def collapsed_at(self, pl_module: L.LightningModule) -> int | None:
        """The step the training loss collapsed at, or None (:func:`collapse_step`)."""
        return collapse_step(self.loss_curve, chance=chance_loss(pl_module))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs,
                           batch, batch_idx: int) -> None:
        """One (step, loss) point per optimiser step: with gradient accumulation over k
        batches, the mean of their losses (Lightning hands each one divided by k)."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        self._step_losses.append(float(loss) * max(1, int(trainer.accumulate_grad_batches)))
        step = int(trainer.global_step)
        if step > self._step_start:  # the optimiser stepped after this batch
            self.loss_curve.append((step, sum(self._step_losses) / len(self._step_losses)))
            self._step_losses = []

    def _log_dir(self, trainer: L.Trainer) -> str | None:
        """The run's folder on rank 0, None elsewhere. ``trainer.log_dir`` broadcasts under
        DDP, so every rank must call it, and call it equally often."""
        log_dir = trainer.log_dir
        return log_dir if trainer.is_global_zero else None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(("val/acc", EXAMPLE_ACC))}
        if "val/acc" not in metrics:
            return
        metrics["step"] = float(trainer.global_step)
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:  # the curves are the training's: a validate of a checkpoint adds no point
            self.val_curve.append((int(trainer.global_step), metrics["val/acc"]))
            if EXAMPLE_ACC in metrics:
                self.example_curve.append((int(trainer.global_step), metrics[EXAMPLE_ACC]))
        self.last = metrics
        if not self.best or metrics["val/acc"] > self.best["val/acc"]:
            self.best = metrics
        if EXAMPLE_ACC in metrics and (not self.best_example or
                                       metrics[EXAMPLE_ACC] > self.best_example[EXAMPLE_ACC]):
            self.best_example = metrics
        if fitting:
            self.pending = True  # the checkpoint callbacks have not saved yet
        else:
            self.write(trainer, pl_module, finished=False, log_dir=self._log_dir(trainer))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule,
                             batch, batch_idx: int) -> None:
        if not self._step_losses:
            self._step_start = int(trainer.global_step)
        if self.pending:
            self.write(trainer, pl_module, finished=False)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        """Writes the file once more with ``stopped_by`` set, when a validation has written
        it (or waits to): a run stopped before its first validation leaves none, as before."""
        self.stopped_by = stop_cause(exception)
        written = self.log_dir is not None and (Path(self.log_dir) / self.filename).exists()
        if self.pending or written:
            self.write(trainer, pl_module, finished=False)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer, pl_module, finished=True)

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, finished: bool,
              log_dir: str | None = None) -> None:
        """Write the file on rank 0 (``log_dir`` defaults to the one cached at fit start)."""
        self.pending = False
        log_dir = log_dir or self.log_dir
        if log_dir is None or not trainer.is_global_zero:
            return
        ckpt = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
        hp = pl_module.hparams_for_logging() if hasattr(pl_module, "hparams_for_logging") else {}
        write_json_atomic(Path(log_dir) / self.filename, {
            "finished": finished,
            "stopped_by": self.stopped_by,
            "val_acc": self.best.get("val/acc"),
            "last_val_acc": self.last.get("val/acc"),
            "best_step": self.best.get("step"),
            "slices": {k[len("val/acc_"):]: v for k, v in self.best.items()
                       if k.startswith("val/acc_")},
            "example_acc": self.best_example.get(EXAMPLE_ACC),
            "last_example_acc": self.last.get(EXAMPLE_ACC),
            "example_best_step": self.best_example.get("step"),
            "example_slices": {k[len(EXAMPLE_ACC) + 1:]: v for k, v in self.best_example.items()
                               if k.startswith(EXAMPLE_ACC + "_")},
            "global_step": trainer.global_step,
            # the strategy's device: by on_fit_end Lightning's teardown has moved the module to the CPU
            "device": device_name(trainer.strategy.root_device),
            "converged": self.converged(),
            "collapsed_at": self.collapsed_at(pl_module),
            "val_curve": [list(p) for p in self.val_curve],
            "example_curve": [list(p) for p in self.example_curve],
            "loss_curve": [list(p) for p in block_means(self.loss_curve)],
            "wall_time_s": self.wall_time_s(),
            "hparams": hp,
            "best_checkpoint": getattr(ckpt, "best_model_path", None) or None,
            "last_checkpoint": getattr(ckpt, "last_model_path", None) or None,
            "log_dir": log_dir,
        })
