"""``python -m sweeps report``: a study's tables, runs and plots under ``results/<study>/``.

The study is loaded once; its trials feed the table (:mod:`sweeps.report.rows`,
:mod:`sweeps.report.table`: mean ± std over seeds at each point's best learning rate),
``runs.csv`` (:mod:`sweeps.report.runs`), ``halving.md`` (:mod:`sweeps.halving`) and the
spec's plots (:mod:`sweeps.report.plots`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from sweeps.halving import write_halving
from sweeps.report.plots import write_plot
from sweeps.report.rows import rows
from sweeps.report.runs import write_runs
from sweeps.report.settings import task_rows
from sweeps.report.table import write_table
from sweeps.spec import SweepSpec
from sweeps.trials import Trials, valued_by

DEFAULT_PLOTS = [{"x": "state_size", "series": "feature_map", "xscale": "log"}]
"""The plot of a spec that names none."""


def study_trials(spec: SweepSpec, storage: Any) -> Trials:
    """Every trial of the spec's study in ``storage``, loaded once for the whole report, each
    valued by the spec's objective (:func:`~sweeps.trials.valued_by`)."""
    study = optuna.load_study(study_name=spec.study, storage=storage)
    return valued_by(study.get_trials(deepcopy=False), spec.metric)


def write_report(spec: SweepSpec, storage: Any, results: Path) -> list[Path]:
    """``results/<study>/table.md``, ``table.csv``, ``runs.csv``, ``halving.md`` (the lr
    sub-grid under successive halving, :mod:`sweeps.halving`) and the spec's plots."""
    out = results / spec.study
    out.mkdir(parents=True, exist_ok=True)
    trials = study_trials(spec, storage)
    table = rows(spec, trials)
    paths = write_table(spec, table, out) + [write_runs(spec, trials, out)]
    paths += write_halving(spec, trials, out)
    merged = task_rows(spec, table) if spec.settings else table  # a row per point
    paths += [write_plot(table if plot["x"] == "step" else merged, plot, out)
              for plot in spec.plots or DEFAULT_PLOTS]
    return paths
