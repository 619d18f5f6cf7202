"""A run's training-loss curve: the one its sweep record carries, else read back from its
TensorBoard event files.

Runs recorded since 2026-12-06 (evening) keep their training loss in ``summary.json`` and the
sweep record as means over blocks of 25 steps (``loss_curve``): that copy travels with the
study's archive, while the event files stay on the machine that trained the run.

Runs log ``train/loss`` every ``trainer.log_every_n_steps`` steps (:mod:`arbench.lit`). A run
that was stopped and resumed from its checkpoint logs each part into its own ``version_<k>``
folder beside the first; its curve is the parts merged, a later part's value standing for a step
that an earlier part had also logged (the steps after its last checkpoint, trained again).
"""

from __future__ import annotations

import re
from pathlib import Path

from arbench.curves import Curve, smoothed

LOSS_TAG = "train/loss"
"""The TensorBoard scalar that holds a run's training loss."""

_VERSION = re.compile(r"version_(\d+)")


def run_parts(log_dir: str | Path) -> list[Path]:
    """The folders holding a run's event files, oldest first: every ``version_<k>`` beside
    ``log_dir`` up to ``log_dir`` itself (when it is one), else ``log_dir`` alone."""
    log_dir = Path(log_dir)
    match = _VERSION.fullmatch(log_dir.name)
    if not match:
        return [log_dir]
    last = int(match.group(1))
    parts = [(int(m.group(1)), p) for p in log_dir.parent.glob("version_*")
             if (m := _VERSION.fullmatch(p.name)) and int(m.group(1)) <= last and p.is_dir()]
    return [p for _, p in sorted(parts)]


def loss_curve(log_dir: str | Path | None) -> list[tuple[int, float]]:
    """``(step, training loss)`` of the run whose folder is ``log_dir``, in step order, from
    every part of it (:func:`run_parts`); ``[]`` when the folder or the tag is missing (a run
    trained on another machine, or before its loss was logged)."""
    if not log_dir or not Path(log_dir).is_dir():
        return []
    # here: keeps tensorboard out of the reports that plot no loss
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    by_step: dict[int, float] = {}
    for part in run_parts(log_dir):
        events = EventAccumulator(str(part), size_guidance={"scalars": 0})
        events.Reload()
        if LOSS_TAG in events.Tags().get("scalars", []):
            by_step.update((int(e.step), float(e.value)) for e in events.Scalars(LOSS_TAG))
    return sorted(by_step.items())


def run_loss_curve(recorded: Curve | None, log_dir: str | Path | None) -> list[tuple[int, float]]:
    """A run's training-loss curve: ``recorded`` (its record's block means) when it has one,
    else its event files' (:func:`loss_curve`)."""
    if recorded:
        return [(int(step), float(value)) for step, value in recorded]
    return loss_curve(log_dir)


def smoothed_loss_curves(log_dirs: list[str | None], window: int,
                         recorded: list[Curve | None] | None = None) -> list[Curve]:
    """Each run's loss curve (:func:`run_loss_curve`; ``recorded[i]`` goes with
    ``log_dirs[i]``), smoothed by trailing means over ``window`` logged values
    (:func:`arbench.curves.smoothed`); runs without one are left out."""
    recorded = list(recorded or [])
    recorded += [None] * (len(log_dirs) - len(recorded))
    curves = (run_loss_curve(r, d) for r, d in zip(recorded, log_dirs, strict=True))
    return [smoothed(curve, window) for curve in curves if curve]


__all__ = ["LOSS_TAG", "loss_curve", "run_loss_curve", "run_parts", "smoothed_loss_curves"]
