"""What a retried trial keeps of the trial it replaces: its point, never its rung values.

Successive halving records the value a trial had at each rung it reached as the system attr
``completed_rung_<k>`` and skips a rung the trial already holds. A retry (a stale trial queued
again by the storage, or a failed one by ``--retry-failed``) copies the system attrs of the
trial it replaces, so it would pass every rung that trial had passed without being judged,
even when it trains again from step 0. Here the retry starts with no rung values
(:func:`without_rungs`); when it resumes from a checkpoint, the replaced trials' validations up
to the checkpoint's step are reported again and judged in order (:func:`replay_curve`), so the
retry meets each rung the run had passed with the value the run had there, against the
bracket as it stands now.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial

RUNG_PREFIX = "completed_rung_"


def without_rungs(system_attrs: dict[str, Any]) -> dict[str, Any]:
    """``system_attrs`` less every ``completed_rung_<k>`` value."""
    return {k: v for k, v in system_attrs.items() if not k.startswith(RUNG_PREFIX)}


class RetryStaleWithoutRungs(RetryHeartbeatStaleTrialCallback):
    """Optuna's stale-trial retry, queuing the copy without the stale trial's rung values."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        clean = copy.copy(trial)
        clean.system_attrs = without_rungs(trial.system_attrs)
        super().__call__(study, clean)


def replaced_trials(study: optuna.Study, trial: FrozenTrial) -> list[FrozenTrial]:
    """The trials ``trial`` retries, oldest first. Optuna's stale retry names the first failed
    trial of a chain in ``failed_trial`` and every one in ``retry_history``; ``--retry-failed``
    names the trial it replaces, whose own attrs name its predecessors."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    found: set[int] = set()
    todo = [trial]
    while todo:
        attrs = todo.pop().system_attrs
        for number in [*attrs.get("retry_history", []), attrs.get("failed_trial")]:
            if number in by_number and number not in found and number != trial.number:
                found.add(number)
                todo.append(by_number[number])
    return [by_number[n] for n in sorted(found)]


def replaced_curve(study: optuna.Study, trial: FrozenTrial) -> dict[int, float]:
    """The validations (step -> value) of the trials ``trial`` retries; a later trial's value
    wins at a step two of them hold."""
    curve: dict[int, float] = {}
    for old in replaced_trials(study, trial):
        curve.update(old.intermediate_values)
    return curve


def checkpoint_progress(path: str | Path) -> tuple[int, float]:
    """How far a Lightning checkpoint's run had got when it was saved: its ``global_step``, and
    the seconds it had trained (the ``wall_time_s`` of its ``RunSummary`` callback state,
    ``arbench/summary.py``, summed over the run's earlier resumes; 0 without one). Read with
    :func:`arbench.ckpt_check.read_checkpoint` (one-line errors for a missing or bad file)."""
    from arbench.ckpt_check import read_checkpoint  # here: keeps torch out of CLI start-up
    from arbench.summary import RunSummary

    state = read_checkpoint(str(path), "resume from")
    summary = state.get("callbacks", {}).get(RunSummary.__qualname__, {})  # Lightning's key
    return int(state["global_step"]), float(summary.get("wall_time_s", 0.0))


def replay_curve(trial: optuna.Trial, up_to_step: int) -> None:
    """Report the replaced trials' validations at steps <= ``up_to_step`` on ``trial`` and ask
    the pruner after each; raises ``optuna.TrialPruned`` where it stops the run."""
    frozen = trial.study._storage.get_trial(trial._trial_id)
    curve = replaced_curve(trial.study, frozen)
    for step in sorted(s for s in curve if s <= up_to_step):
        trial.report(curve[step], step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} on the resumed run's curve "
                                     f"(value {curve[step]:.4f})")
