"""``python -m sweeps status``: each study's trials by state, hours left, what is running."""

from __future__ import annotations

import statistics
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.runtime import expected_seconds, timed_runs
from sweeps.trials import UNFINISHED, Trials, is_lock_study, state_counts


def count_states(study_name: str, storage: Any) -> dict[str, int]:
    """:func:`sweeps.trials.state_counts` of the study ``study_name`` in ``storage``."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    return state_counts(study.get_trials(deepcopy=False))


def run_time_left(trials: Trials) -> str:
    """``~H h of runs left (median run S s)``, in one worker's hours; empty when nothing is
    queued or nothing has finished. Each queued or running trial counts its expected run time
    (:func:`sweeps.runtime.expected_seconds`: the median of the nearest finished runs). The
    median run shown is the own runs' (the reused runs' when there are none)."""
    left = [t for t in trials if t.state in UNFINISHED]
    timed = timed_runs(trials)
    if not left or not timed:
        return ""
    total = sum(expected_seconds(trial, timed) or 0.0 for trial in left)
    own_times = [run.seconds for run in timed if run.own]
    median = statistics.median(own_times or [run.seconds for run in timed])
    return f"  ~{total / 3600:.1f} h of runs left (median run {median:.0f} s)"


def running_line(t: optuna.trial.FrozenTrial) -> str:
    """``  running: <run> since HH:MM, step S: V`` for a running trial (its last validation;
    ``no validation yet`` before the first; ``(a retry)`` when it replaces a failed trial)."""
    name = t.user_attrs.get("run_name", f"trial {t.number}")
    since = t.datetime_start.strftime("%H:%M") if t.datetime_start else "?"
    retry = " (a retry)" if "failed_trial" in t.system_attrs else ""
    if t.intermediate_values:
        step = max(t.intermediate_values)
        where = f"step {step}: {t.intermediate_values[step]:.4f}"
    else:
        where = "no validation yet"
    return f"  running: {name}{retry} since {since}, {where}"


def status_lines(storage: Any) -> list[str]:
    """One line per study: its trial counts by state and :func:`run_time_left`, then one
    :func:`running_line` per running trial."""
    lines = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if is_lock_study(summary.study_name):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        lines.append(f"{summary.study_name:<24} " + "  ".join(
            f"{k} {v}" for k, v in state_counts(trials).items()) + run_time_left(trials))
        lines += [running_line(t) for t in trials if t.state == TrialState.RUNNING]
    return lines or ["no studies"]

