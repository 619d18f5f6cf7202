"""``runs.csv``: one row per run of the study (every trial, whatever its state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from arbench.objective import ACC, EXAMPLE_ACC
from arbench.tables import write_csv
from sweeps.report.rows import run_converged
from sweeps.spec import SweepSpec
from sweeps.trials import LR, SEED, VARYING, Trials, run_value

RUN_FIELDS = ("trial", "state", "lr", "seed", "objective", "val_acc", "last_val_acc", "steps",
              "converged", "collapsed_at", "diverged", "wall_time_s", "device", "fail_reason",
              "reused_from")

OVERALL = {ACC: ("val_acc", "last_val_acc"), EXAMPLE_ACC: ("example_acc", "last_example_acc")}
"""The runs.csv columns (best, last) an overall objective's values also fill for a pruned run."""


def run_rows(spec: SweepSpec, trials: Trials) -> list[dict[str, Any]]:
    """One row per trial of the study: its grid values, lr, seed, ``objective`` (the study's
    metric as the table counts it, :func:`~sweeps.trials.run_value`: a completed run's value,
    a pruned run's best intermediate value; empty for a run with neither), best and last
    overall val/acc, steps, the convergence verdict on the study's objective (:func:`~sweeps.report.rows.
    run_converged`, the table's) and the collapse verdict, wall time, the device it trained on and
    state (fail reason). A pruned run recorded before its ``summary.json`` values were kept
    (:func:`sweeps.worker.record_pruned`) gets its best and last intermediate value, the
    objective, in the objective's own columns (``val_acc`` or ``example_acc``) only where the
    objective is that overall metric: a per-slice objective's values (``val/acc_<slice>``) go in
    ``objective`` alone, never beside completed runs' overall accuracy."""
    keys = sorted({k for t in trials for k in t.params if k not in VARYING})
    out = []
    for t in trials:
        ua = dict(t.user_attrs)
        valued = t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED
                                                    and bool(t.intermediate_values))
        objective = run_value(t, spec.direction == "maximize") if valued else None
        if t.state == TrialState.PRUNED and t.intermediate_values:
            steps = sorted(t.intermediate_values)
            ua.setdefault("global_step", steps[-1])
            columns = OVERALL.get(spec.metric)  # None: a per-slice objective
            if columns:
                ua.setdefault(columns[0], objective)
                ua.setdefault(columns[1], t.intermediate_values[steps[-1]])
        out.append({"trial": t.number, "state": t.state.name.lower(),
                    **{k: t.params.get(k) for k in keys},
                    "lr": t.params.get(LR), "seed": t.params.get(SEED), "objective": objective,
                    "val_acc": ua.get("val_acc"), "last_val_acc": ua.get("last_val_acc"),
                    "steps": ua.get("global_step"), "converged": run_converged(t, spec.metric),
                    "collapsed_at": ua.get("collapsed_at"), "diverged": ua.get("diverged"),
                    "wall_time_s": ua.get("wall_time_s"),
                    "device": ua.get("device"), "fail_reason": ua.get("fail_reason"),
                    "reused_from": ua.get("reused_from")})
        if any("example_acc" in tr.user_attrs for tr in trials):  # runs since zoology's metric
            out[-1].update(example_acc=ua.get("example_acc"),
                           last_example_acc=ua.get("last_example_acc"))
    return out


def write_runs(spec: SweepSpec, trials: Trials, out: Path) -> Path:
    """``runs.csv``: :func:`run_rows`, one row per run."""
    runs = run_rows(spec, trials)
    return write_csv(out / "runs.csv", runs, None if runs else RUN_FIELDS)

