"""``runs.csv``: one row per run of the study (every trial, whatever its state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from arbench.objective import EXAMPLE_ACC
from arbench.tables import write_csv
from sweeps.report.rows import run_converged
from sweeps.spec import SweepSpec
from sweeps.trials import LR, SEED, VARYING, Trials, run_value

RUN_FIELDS = ("trial", "state", "lr", "seed", "val_acc", "last_val_acc", "steps", "converged",
              "collapsed_at", "diverged", "wall_time_s", "device", "fail_reason", "reused_from")


def run_rows(spec: SweepSpec, trials: Trials) -> list[dict[str, Any]]:
    """One row per trial of the study: its grid values, lr, seed, best and last val/acc,
    steps, the convergence verdict on the study's objective (:func:`~sweeps.report.rows.
    run_converged`, the table's) and the collapse verdict, wall time, the device it trained on and
    state (fail reason). A pruned run recorded before its ``summary.json`` values were kept
    (:func:`sweeps.worker.record_pruned`) gets its best and last intermediate value, the
    objective, in the objective's own columns (``val_acc`` or ``example_acc``), never in the
    other metric's."""
    keys = sorted({k for t in trials for k in t.params if k not in VARYING})
    out = []
    for t in trials:
        ua = dict(t.user_attrs)
        if t.state == TrialState.PRUNED and t.intermediate_values:
            steps = sorted(t.intermediate_values)
            best, last = ("example_acc", "last_example_acc") if spec.metric == EXAMPLE_ACC \
                else ("val_acc", "last_val_acc")
            ua.setdefault(best, run_value(t, spec.direction == "maximize"))
            ua.setdefault(last, t.intermediate_values[steps[-1]])
            ua.setdefault("global_step", steps[-1])
        out.append({"trial": t.number, "state": t.state.name.lower(),
                    **{k: t.params.get(k) for k in keys},
                    "lr": t.params.get(LR), "seed": t.params.get(SEED),
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

