"""The end-of-run report: the lines every ``fit``, ``validate`` and ``test`` of ``main.py`` prints
last, saying what the run found.

:class:`EndOfRunReport` (a callback the CLI adds; sweeps never do) gathers a :class:`RunResult`
when the run ends (Lightning's ``teardown``, after its own closing lines and results table) or
is stopped by Ctrl-C or SIGTERM (``on_exception`` with a ``KeyboardInterrupt`` or Lightning's
``SIGTERMException``, after :class:`RunSummary` has written what the run reached), and
:func:`format_report` turns it into text: best and last
accuracy per answer token and zoology's per example (``val/example_acc``, at its own best
validation), any other ``<prefix>/acc_*`` metric that is not a slice, per-slice accuracy as a
table, the
converged / collapsed verdicts of :mod:`arbench.curves`, wall time and tokens per second, the
run folder, its ``summary.json``, the checkpoints and the ``tensorboard`` line. Only files that
exist are named. Accuracies print in percent (micro accuracy over answer positions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from arbench.ckpt_check import read_checkpoint
from arbench.curves import COLLAPSE_HIGH, COLLAPSE_LOW, CONVERGED_RISE, STOP_THRESHOLD
from arbench.objective import EXAMPLE_ACC
from arbench.summary import RunSummary, stop_cause

STAGES = {TrainerFn.FITTING: "fit", TrainerFn.VALIDATING: "validate", TrainerFn.TESTING: "test"}
"""The trainer functions that end with a report, by subcommand name."""


@dataclass
class RunResult:
    """What one run reached, as :func:`format_report` prints it.

    ``best`` and ``last``: the metrics of the best and the last evaluation (``<prefix>/acc``,
    ``<prefix>/acc_<slice>``, other ``<prefix>/acc_*`` metrics, and ``step`` for fit), as
    fractions in [0, 1]; ``stopped_by``: what stopped an ``interrupted`` run (``Ctrl-C``,
    ``SIGTERM``); ``best`` is empty for ``validate`` and ``test`` (one evaluation).
    ``wall_time_s``: the run's wall time in seconds, including the runs it resumes;
    ``process_s`` and ``tokens``: this process's seconds and tokens (trained for fit,
    evaluated otherwise). Paths are None when the file does not exist.
    """

    stage: str
    interrupted: bool
    step: int
    prefix: str
    best: dict[str, float]
    last: dict[str, float]
    slices: list[str]
    converged: bool | None
    collapsed_at: int | None
    wall_time_s: float
    process_s: float
    tokens: int
    log_dir: str | None = None
    summary: str | None = None
    checkpoints: dict[str, tuple[str, int]] = field(default_factory=dict)  # label -> (path, step)
    stopped_by: str = "Ctrl-C"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _metric_lines(result: RunResult) -> list[str]:
    """One line per accuracy that is not a slice: best (at its step) and last, or the value."""
    example = f"{result.prefix}/example_acc"
    names = [f"{result.prefix}/acc", example] + sorted(
        key for key in {*result.best, *result.last}
        if key.startswith(f"{result.prefix}/acc_")
        and key[len(result.prefix) + 5:] not in result.slices)
    width = max(len(name) for name in names)
    lines = []
    for name in names:
        last = result.last.get(name)
        if name not in result.best and last is None:
            continue
        if result.best:  # zoology's metric at its own best validation
            step = result.best.get("example_step" if name == example else "step")
            at = f" at step {int(step)}" if step is not None else ""
            lines.append(f"  {name:<{width}}  best {_percent(result.best.get(name))}{at}, "
                         f"last {_percent(last)}")
        else:
            lines.append(f"  {name:<{width}}  {_percent(last)}")
    return lines


def _slice_table(result: RunResult) -> list[str]:
    """Per-slice accuracy (``L<length>_N<pairs>``): best and last columns for fit, else one."""
    key = f"{result.prefix}/acc_"
    rows = [s for s in result.slices if key + s in result.best or key + s in result.last]
    if not rows:
        return []
    width = max(len("slice"), *(len(s) for s in rows))
    columns = [("best", result.best), ("last", result.last)] if result.best else \
        [(f"{result.prefix}/acc", result.last)]
    head = "".join(f"  {title:>9}" for title, _ in columns)
    lines = [f"  {'slice':<{width}}{head}"]
    for name in rows:
        cells = "".join(f"  {_percent(values.get(key + name)):>9}" for _, values in columns)
        lines.append(f"  {name:<{width}}{cells}")
    return lines


def _verdict_lines(result: RunResult) -> list[str]:
    if result.converged is None and result.collapsed_at is None:
        return []
    trained = "" if result.stage == "fit" else " (the training, from the checkpoint)"
    if result.converged is None:
        converged = "unknown (no validation)"
    elif result.converged:
        converged = (f"yes (val/acc rose < {100 * CONVERGED_RISE:g} point over the last "
                     f"quarter of the steps, or reached {100 * STOP_THRESHOLD:g} %)")
    else:
        converged = "no (val/acc still rising over the last quarter of the steps, or too " \
                    "few validations to tell)"
    collapsed = "no" if result.collapsed_at is None else \
        (f"yes, at step {result.collapsed_at} (the training loss fell under "
         f"{100 * COLLAPSE_LOW:g} % of its start, then climbed back over {100 * COLLAPSE_HIGH:g} %)")
    return [f"  converged{trained}: {converged}", f"  collapsed: {collapsed}"]


def _seconds(seconds: float) -> str:
    """``8.2 s``, ``412 s (6.9 min)``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s" + (f" ({seconds / 60:.1f} min)" if seconds >= 120 else "")


def _time_lines(result: RunResult) -> list[str]:
    """The wall time, and this process's tokens per second (trained, or evaluated)."""
    lines = [f"  wall time: {_seconds(result.wall_time_s)}"]
    if result.wall_time_s - result.process_s > 1:
        lines[0] += f", {_seconds(result.process_s)} of it in this process (resumed)"
    if result.tokens and result.process_s > 0:
        what = "trained" if result.stage == "fit" else "evaluated"
        lines.append(f"  speed: {result.tokens / result.process_s:,.0f} tokens/s "
                     f"({result.tokens:,} tokens {what} in {_seconds(result.process_s)}"
                     + (", validations included)" if result.stage == "fit" else ")"))
    return lines


def format_report(result: RunResult) -> str:
    """The report's lines (see the module docstring), ending with the ``tensorboard`` line."""
    status = f"stopped by {result.stopped_by}" if result.interrupted else "finished"
    where = f" ({result.log_dir})" if result.log_dir else ""
    reached = f"at step {result.step}" if result.stage == "fit" else \
        f"(the model of training step {result.step})"
    lines = [f"result of {result.stage}{where}: {status} {reached}"]
    if result.last or result.best:
        lines += _metric_lines(result) + _slice_table(result)
    else:
        lines.append(f"  {result.prefix}/acc: no evaluation reached")
    lines += _verdict_lines(result)
    lines += _time_lines(result)
    if result.log_dir:
        lines.append(f"  run folder: {result.log_dir}")
    if result.summary:
        lines.append(f"  summary: {result.summary}")
    elif result.stage == "test":
        lines.append("  summary: none (test writes no summary.json; its metrics are in the run "
                     "folder's TensorBoard events)")
    else:
        lines.append("  summary: none (no validation was made)")
    lines += [f"  {label}: {path} (step {step})"
              for label, (path, step) in result.checkpoints.items()]
    if result.log_dir:
        lines.append(f"  see it: tensorboard --logdir {result.log_dir}")
    return "\n".join(lines)


def _existing(path: str | None) -> str | None:
    return path if path and Path(path).is_file() else None


def _run_summary(trainer: L.Trainer) -> RunSummary | None:
    return next((c for c in trainer.callbacks if isinstance(c, RunSummary)), None)


def _checkpoint_step(path: str) -> int:
    """The training step a checkpoint was saved at."""
    return int(read_checkpoint(path, "--ckpt_path").get("global_step", 0))


class EndOfRunReport(Callback):
    """Prints :func:`format_report` on rank 0 when ``fit``, ``validate`` or ``test`` ends or
    is stopped by Ctrl-C or SIGTERM. Counts this process's tokens (inputs, ``(batch, seq)`` per batch):
    trained during fit, evaluated during validate and test."""

    def __init__(self) -> None:
        self.start = time.time()
        self.tokens = 0
        self.log_dir: str | None = None
        # validate / test: the training's verdicts, from the curves the checkpoint carries
        self.trained: tuple[bool | None, int | None] = (None, None)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.start, self.tokens = time.time(), 0
        log_dir = trainer.log_dir  # broadcast under DDP: every rank calls it, once
        self.log_dir = log_dir if trainer.is_global_zero else None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs,
                           batch, batch_idx: int) -> None:
        self.tokens += batch[0].numel()

    def _count_evaluated(self, trainer: L.Trainer, batch) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self.tokens += batch[0].numel()

    def _judge_the_training(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before ``validate`` or ``test`` evaluates (the checkpoint restored, nothing added to
        its curves yet), keep the verdicts on the training the checkpoint carries."""
        summary = _run_summary(trainer)
        if trainer.state.fn != TrainerFn.FITTING and summary is not None and summary.loss_curve:
            self.trained = (summary.converged(), summary.collapsed_at(pl_module))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._judge_the_training(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._judge_the_training(trainer, pl_module)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._count_evaluated(trainer, batch)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs,
                          batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._count_evaluated(trainer, batch)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.report(trainer, pl_module, interrupted=False)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     exception: BaseException) -> None:
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            self.report(trainer, pl_module, interrupted=True, stopped_by=stop_cause(exception))

    def report(self, trainer: L.Trainer, pl_module: L.LightningModule, interrupted: bool,
               stopped_by: str = "Ctrl-C") -> None:
        """Print the report (rank 0 only; nothing for ``predict``)."""
        stage = STAGES.get(trainer.state.fn)
        if stage is None or not trainer.is_global_zero:
            return
        result = self.result(trainer, pl_module, stage, interrupted)
        result.stopped_by = stopped_by
        print("\n" + format_report(result), flush=True)

    def result(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str,
               interrupted: bool) -> RunResult:
        """What the run reached, from :class:`RunSummary` (best, last, curves, wall time) and
        the trainer (this evaluation's metrics, checkpoints)."""
        summary = _run_summary(trainer)
        process_s = time.time() - self.start
        prefix = "test" if stage == "test" else "val"
        evaluated = {k: float(v) for k, v in trainer.callback_metrics.items()
                     if k.startswith((f"{prefix}/acc", f"{prefix}/example_acc"))}
        best, last = (summary.best, summary.last) if stage == "fit" and summary else ({}, evaluated)
        if stage == "fit" and summary is not None and summary.best_example:
            best = {**best, EXAMPLE_ACC: summary.best_example[EXAMPLE_ACC],
                    "example_step": summary.best_example.get("step")}
        converged, collapsed_at = self.trained
        if stage == "fit" and summary is not None:
            converged, collapsed_at = summary.converged(), summary.collapsed_at(pl_module)
        summary_path = None
        if summary is not None and self.log_dir and stage != "test":
            summary_path = _existing(str(Path(self.log_dir) / summary.filename))
        return RunResult(
            stage=stage, interrupted=interrupted, step=self._step(trainer, stage), prefix=prefix,
            best=dict(best), last=dict(last), slices=list(getattr(pl_module, "slice_names", [])),
            converged=converged, collapsed_at=collapsed_at,
            wall_time_s=summary.wall_time_s() if stage == "fit" and summary else process_s,
            process_s=process_s, tokens=self.tokens, log_dir=self.log_dir,
            summary=summary_path, checkpoints=self._checkpoints(trainer, stage))

    @staticmethod
    def _step(trainer: L.Trainer, stage: str) -> int:
        """The training step reached: the trainer's for fit, the checkpoint's otherwise."""
        if stage == "fit" or not _existing(trainer.ckpt_path):
            return int(trainer.global_step)
        return _checkpoint_step(trainer.ckpt_path)

    @staticmethod
    def _checkpoints(trainer: L.Trainer, stage: str) -> dict[str, tuple[str, int]]:
        """``label -> (path, step saved at)`` of the checkpoints that exist: the best and the
        last of a fit, the one evaluated otherwise."""
        if stage != "fit":
            found = {"checkpoint evaluated": _existing(trainer.ckpt_path)}
        else:
            ckpt = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
            found = {"best checkpoint": _existing(getattr(ckpt, "best_model_path", None)),
                     "last checkpoint": _existing(getattr(ckpt, "last_model_path", None))}
        return {label: (path, _checkpoint_step(path)) for label, path in found.items() if path}


__all__ = ["EndOfRunReport", "RunResult", "format_report"]
