"""``python -m sweeps suite``: one grid over several tasks (a study each), as a method × task table.

A suite is a list of specs, one per task (``sweeps/suite_<task>.yaml``), that share one grid.
A *method* is a grid point less seed and lr (:data:`sweeps.trials.VARYING`) and, for a task
trained one run per difficulty setting (a spec's ``settings:``), less its setting; in each
task's study it sits at that study's best lr for it (:func:`sweeps.report.rows.rows`, as
``report`` picks it, per setting). MAD's aggregate (Poli et al. 2024, mad-lab): a run's *task
score* is the mean of its accuracy over the task's difficulty settings: its test slices (each
slice's val/acc at the run's best validation, as ``table.md``'s slice columns), and, where
each setting is a run of its own, the mean over those runs, each at its setting's best lr
(:func:`sweeps.report.settings.task_rows`); a cell is the mean ± sample std of the task score
over the seeds; a method's aggregate is the mean
of its cells over the tasks, with the std over the seeds every task has of each seed's mean
over tasks. A cell with no finished run is missing (never 0), and so is the aggregate of a
method missing on any task; a cell whose point has runs still to finish is marked partial, and
one whose runs at the best lr the protocol flags (collapsed, not converged, pruned, ...: as the
task's ``table.md`` flags its rows) is marked flagged, the flags listed under the table.

:func:`write_suite` writes ``table.md`` (the progress of each task's study, the table, each
cell's best lr, the specs' claims checked seed by seed per task), ``table.csv`` (one row per
method; fractions, not percent) and ``heatmap.png``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from arbench.defaults import DEFAULT_N_LAYERS
from arbench.objective import EXAMPLE_ACC
from arbench.tables import markdown_table, write_csv
from sweeps.names import trial_name
from sweeps.report import study_trials
from sweeps.report.labels import TASK_MODEL_KEYS, label, task_model
from sweeps.report.plots import write_heatmap
from sweeps.report.rows import rows
from sweeps.report.settings import lrs_text, task_rows
from sweeps.report.table import claim_rows
from sweeps.report.table import flags as row_flags
from sweeps.spec import SETTING, SpecError, SweepSpec
from sweeps.trials import (
    RESULTS,
    VARYING,
    Trials,
    failed_points,
    grid_point,
    point_key,
    state_counts,
)

METHOD_FREE = (*VARYING, SETTING)
"""The grid keys a suite's method averages over: seed and lr, and a task's setting."""

AGGREGATE = "aggregate"
"""The aggregate's column name (table.md, table.csv's ``aggregate_*``, the heat map)."""


@dataclass
class Cell:
    """One method on one task: each seed's task score (a fraction) at the point's best lr
    (``{setting: best lr}``, the key None for a task without settings); ``flags``: the
    protocol's warnings on its runs there (:func:`sweeps.report.table.flags`, "" for none)."""

    scores: dict[Any, float]
    best_lrs: dict[str | None, float]
    partial: bool = False
    flags: str = ""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores.values())

    @property
    def std(self) -> float:
        """Sample std over seeds (0 for one seed)."""
        return statistics.stdev(self.scores.values()) if len(self.scores) > 1 else 0.0

    @property
    def n(self) -> int:
        return len(self.scores)


@dataclass
class Method:
    """A row of the suite: a grid point less seed, lr and setting, with its cell on each task
    (and, on a task with settings whose runs have not reached every setting,
    ``(settings run, settings)`` there instead)."""

    key: tuple
    label: str
    hparams: dict[str, Any] = field(default_factory=dict)
    cells: dict[str, Cell] = field(default_factory=dict)
    settings_done: dict[str, tuple[int, int]] = field(default_factory=dict)

    def aggregate(self, tasks: list[str]) -> Cell | None:
        """Each seed's mean task score over ``tasks``, for the seeds every task has (its std
        is the aggregate's spread; its mean equals :func:`aggregate_mean` when every task has
        the same seeds); None when a task has no cell."""
        if not tasks or any(t not in self.cells for t in tasks):
            return None
        seeds = set.intersection(*(set(self.cells[t].scores) for t in tasks))
        flagged = [t for t in tasks if self.cells[t].flags]
        return Cell({s: statistics.fmean(self.cells[t].scores[s] for t in tasks)
                     for s in sorted(seeds, key=str)}, best_lrs={},
                    partial=any(self.cells[t].partial for t in tasks),
                    flags=f"flagged on {', '.join(flagged)}" if flagged else "")


def aggregate_mean(method: Method, tasks: list[str]) -> float | None:
    """MAD's aggregate: the mean over ``tasks`` of the method's cell means (None when a task
    has no cell)."""
    if not tasks or any(t not in method.cells for t in tasks):
        return None
    return statistics.fmean(method.cells[t].mean for t in tasks)


def task_names(specs: list[SweepSpec]) -> list[str]:
    """Each spec's task: its study name less the ``_``-separated prefix all share
    (``suite_mqar``, ``suite_overwrite`` -> ``mqar``, ``overwrite``); one spec: its study."""
    parts = [spec.study.split("_") for spec in specs]
    k = 0
    while len(parts) > 1 and all(len(p) > k + 1 for p in parts) and len({p[k] for p in parts}) == 1:
        k += 1
    return ["_".join(p[k:]) for p in parts]


def check_suite(specs: list[SweepSpec]) -> None:
    """One grid across the specs: the same grid (keys, values, order), model size and storage,
    the metric of the task scores (:func:`score_metric`) and the objective's direction, and a
    study each; else :class:`SpecError` in one line naming the first difference. The lr
    sub-grids may differ (a task's profile may need its own)."""
    if not specs:
        raise SpecError("a suite needs at least one spec")
    first = specs[0]
    studies = [spec.study for spec in specs]
    if len(set(studies)) < len(studies):
        raise SpecError(f"a study is named twice in {', '.join(studies)}: a suite takes one "
                        "spec per task")
    for spec in specs[1:]:
        if spec.grid != first.grid:
            keys = [*first.grid, *(k for k in spec.grid if k not in first.grid)]
            key = next(k for k in keys if spec.grid.get(k) != first.grid.get(k))
            raise SpecError(f"{spec.path} and {first.path} have different grids (grid.{key}: "
                            f"{spec.grid.get(key)!r:.80} against {first.grid.get(key)!r:.80}); "
                            "a suite compares one grid across its tasks")
        if spec.size != first.size:
            raise SpecError(f"{spec.path} and {first.path} set different model sizes "
                            f"({spec.size} against {first.size}); a suite compares one grid")
        if (score_metric(spec), spec.direction) != (score_metric(first), first.direction):
            raise SpecError(f"{spec.path} and {first.path} judge runs differently ("
                            f"{spec.direction} {spec.metric} against {first.direction} "
                            f"{first.metric}); a suite's cells and aggregate need one metric")
        if spec.storage != first.storage:
            raise SpecError(f"{spec.path} and {first.path} name different storages: give the "
                            "suite's with --storage")


def score_metric(spec: SweepSpec) -> str:
    """The metric a spec's task scores are in: zoology's per-example accuracy where its
    objective is that metric or a slice of it, else val/acc (:func:`sweeps.report.rows.
    run_slices`)."""
    return EXAMPLE_ACC if spec.metric.startswith(EXAMPLE_ACC) else "val/acc"


def method_key(point: dict[str, Any]) -> tuple:
    """A method's key: :func:`sweeps.trials.point_key` less seed, lr and setting."""
    return point_key(point, free=METHOD_FREE)


def grid_methods(spec: SweepSpec) -> dict[tuple, dict[str, Any]]:
    """``{method key: its grid values}`` (:func:`method_key`), ordered by the grid's ``config``
    values first (the rows of one method config together), then as the grid lists them."""
    points = {method_key(p): {k: v for k, v in p.items() if k not in METHOD_FREE}
              for p in spec.points()}
    configs = list(dict.fromkeys(str(v.get("config")) for v in points.values()))
    return dict(sorted(points.items(), key=lambda kv: configs.index(str(kv[1].get("config")))))


def progress(spec: SweepSpec, trials: Trials) -> dict[str, int]:
    """``{done, total, failed, running, waiting}``: the spec's grid points (lr and seed
    included) with a finished result (complete or pruned), all of them, the failed points not
    queued again, and the trials running or queued."""
    wanted = {point_key(p, free=()) for p in spec.points()}
    done = {point_key(grid_point(t), free=()) for t in trials if t.state in RESULTS}
    counts = state_counts(trials)
    return {"done": len(wanted & done), "total": len(wanted),
            "failed": len(failed_points(trials)), "running": counts["running"],
            "waiting": counts["waiting"]}


def unfinished_methods(spec: SweepSpec, trials: Trials) -> set[tuple]:
    """The method keys with a grid point (an lr, a seed or a setting) that has no finished
    result yet, or with a run still queued or running (an lr ``--widen`` added is not in the
    grid, and may still become the best)."""
    done = {point_key(grid_point(t), free=()) for t in trials if t.state in RESULTS}
    open_keys = {method_key(p) for p in spec.points() if point_key(p, free=()) not in done}
    return open_keys | {method_key(grid_point(t)) for t in trials
                        if t.state in (TrialState.WAITING, TrialState.RUNNING)}


def task_cells(spec: SweepSpec, trials: Trials) -> tuple[dict[tuple, Cell], list[dict[str, Any]]]:
    """``({method key: Cell}, task rows)``: each method's task score per seed (the seeds whose
    runs recorded slices, at every setting), and the study's rows merged per method
    (:func:`~sweeps.report.settings.task_rows` of :func:`rows`; a row not yet run at every
    setting has no cell, its ``settings_done`` says how far it is). A cell's flags are its
    task row's (:func:`sweeps.report.table.flags`), less the runs unfinished or not started
    (the cell's ``partial``), its seeds counted as the cell's."""
    merged = task_rows(spec, rows(spec, trials))
    open_keys = unfinished_methods(spec, trials)
    cells = {}
    for row in merged:
        key = tuple(sorted(row["point"].items()))
        if row["seed_scores"]:
            warn = row_flags({**row, "n": len(row["seed_scores"]), "unfinished": 0,
                              "not_started": 0})
            cells[key] = Cell(row["seed_scores"], row["best_lrs"], partial=key in open_keys,
                              flags=warn)
    return cells, merged


@dataclass
class Suite:
    """The method × task table of a suite, with what each task's study has done."""

    tasks: list[str]
    specs: list[SweepSpec]
    methods: list[Method]
    progress: dict[str, dict[str, int] | None]
    claims: dict[str, list[dict[str, Any]]]
    models: dict[str, str] = field(default_factory=dict)
    """Per task, what its profile set of the model (e.g. ``"pos-emb 4 layers"``; empty: the
    defaults), from its runs' hparams."""


def method_hparams(hp: dict[str, Any]) -> dict[str, Any]:
    """A method's hparams as the suite names it on every task: less what a task's profile sets
    of the model (:data:`~sweeps.report.labels.TASK_MODEL_KEYS`, shown per task instead), its
    ``state_size`` at the default depth (each conv-and-attention cycle holds the same state, so
    a model of ``n_layers`` holds ``n_layers / 2`` times that)."""
    out = {k: v for k, v in hp.items() if k not in (*TASK_MODEL_KEYS, "setting")}
    depth = hp.get("n_layers") or DEFAULT_N_LAYERS
    if out.get("state_size") and depth != DEFAULT_N_LAYERS:
        out["state_size"] = out["state_size"] * DEFAULT_N_LAYERS // depth
    return out


def build_suite(specs: list[SweepSpec], trials: dict[str, Trials | None]) -> Suite:
    """The suite of ``specs`` (checked by :func:`check_suite`) from each study's ``trials``
    (None: the study has not started). Methods come in grid order; a point that ran but is
    not in the grid (another checkout's config paths) follows as a row of its own."""
    check_suite(specs)
    tasks = task_names(specs)
    methods = {key: Method(key, trial_name(values) + " (no runs yet)")
               for key, values in grid_methods(specs[0]).items()}
    done: dict[str, dict[str, int] | None] = {}
    claims: dict[str, list[dict[str, Any]]] = {}
    models: dict[str, set[str]] = {}
    for task, spec in zip(tasks, specs):
        got = trials.get(spec.study)
        done[task] = None if got is None else progress(spec, got)
        if got is None:
            continue
        cells, table = task_cells(spec, got)
        claims[task] = claim_rows(table, spec.claims)
        for row in table:
            key = tuple(sorted(row["point"].items()))
            method = methods.setdefault(key, Method(key, ""))
            if row["hparams"]:
                models.setdefault(task, set()).add(task_model(row["hparams"]))
            if not method.hparams and row["hparams"]:
                method.hparams = method_hparams(row["hparams"])
                method.label = label(method.hparams)
            if key in cells:
                method.cells[task] = cells[key]
            elif row["settings_done"] < row["settings"] or row.get("short_of_seeds"):
                method.settings_done[task] = (row["settings_done"], row["settings"])
    for method in methods.values():  # a row with runs but no hparams recorded
        method.label = method.label or trial_name(dict(method.key))
    return Suite(tasks, specs, list(methods.values()), done, claims,
                 {t: ", ".join(sorted(m for m in models[t] if m)) for t in models})


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def cell_text(cell: Cell | None, mean: float | None = None,
              settings: tuple[int, int] | None = None) -> str:
    """``"mean ± std (n)"`` in percent (``"mean (1)"`` for one seed, which has no spread),
    ``*`` when partial, ``†`` when flagged; ``"–"`` when missing, and
    ``"– (1 of 3 settings)*"`` for a method not yet run at every setting of its task."""
    if settings is not None and (cell is None or not cell.n):
        if settings[0] == settings[1]:  # every setting has run, no seed at each one's best lr
            return "– (no seed at every setting yet)*"
        return f"– ({settings[0]} of {settings[1]} settings)*"
    if cell is None or not cell.n:
        return "–"
    shown = cell.mean if mean is None else mean
    spread = f" ± {pct(cell.std)}" if cell.n > 1 else ""
    marks = ("*" if cell.partial else "") + ("†" if cell.flags else "")
    return f"{pct(shown)}{spread} ({cell.n}){marks}"


def progress_line(task: str, spec: SweepSpec, done: dict[str, int] | None,
                  model: str = "") -> str:
    """One task's line: its study, profile (and what it sets of the model) and how many of
    its runs are done."""
    setting = f" (model: {model})" if model else ""
    head = f"- {task}: study `{spec.study}`, {spec.profile} profile{setting}, "
    if done is None:
        return head + f"not started (0 of {len(spec.points())} runs)"
    extra = [f"{done[k]} {k}" for k in ("failed", "running", "waiting") if done[k]]
    rest = f" ({', '.join(extra)})" if extra else ""
    return head + f"{done['done']} of {done['total']} runs done{rest}"


def claim_text(claim: dict[str, Any] | None) -> str:
    """A claim on one task: ``"k of n, gap ± std"`` in points, ``" (provisional)"`` while its
    rows have runs unfinished or not started; why not, when unchecked."""
    if claim is None:
        return "–"
    if claim["status"] != "ok" or not claim["n"]:
        return "not checked" if claim["status"] == "ok" else f"not checked ({claim['status']})"
    spread = f" ± {pct(claim['gap_std'])}" if claim["n"] > 1 else ""
    pending = " (provisional)" if claim.get("provisional") else ""
    return f"{claim['k']} of {claim['n']}, {100 * claim['gap_mean']:+.1f}{spread}{pending}"


def suite_markdown(suite: Suite) -> list[str]:
    """table.md's lines: title, what a cell is, each task's progress, the table, best lrs,
    the claims per task."""
    tasks = suite.tasks
    n_done = sum(1 for d in suite.progress.values() if d and d["done"] == d["total"])
    md = [f"# suite: {len(tasks)} tasks × {len(suite.methods)} methods", "",
          "Each cell: a run's task score is its mean accuracy over the task's difficulty "
          "settings (its test slices, val/acc at the run's best validation); the cell is the "
          "mean ± sample std (n seeds) of that score at the point's best learning rate on "
          "that task (picked by each study's objective, as its own table.md). Where a task "
          "trains one run per setting (its spec's settings:), a seed's score is the mean "
          "over those runs, each at its own setting's best lr, for the seeds that have "
          "them all; \"– (k of n settings)*\": not yet run at every setting (\"no seed at "
          "every setting yet\": each has run, but no seed at every one's best lr). *aggregate*: "
          "MAD's, the mean of the method's cells over the tasks, ± the std over the seeds "
          "every task has of each seed's mean over tasks (n those seeds); missing when a task "
          "has no cell. *state size*: floats of recurrent state of a conv and an attention "
          "layer, the default depth; a task whose profile deepens the model (its line below) "
          "holds that per such pair. – : no finished run. * : partial, runs of this point "
          "(an lr, a seed or a setting) not finished yet, so its best lr may still change. † : "
          "flagged, the protocol's warnings on the runs behind the cell (collapsed, not "
          "converged, pruned, fewer seeds than the study's, ...; listed below the table; an "
          "aggregate: a task's cell is). Per-task "
          "tables, runs.csv and plots: `python -m sweeps report SPEC`.", "",
          f"Tasks done: {n_done} of {len(tasks)}.", "",
          *[progress_line(t, s, suite.progress[t], suite.models.get(t, ""))
            for t, s in zip(tasks, suite.specs)], ""]
    header = ["method", "state size", *tasks, AGGREGATE]
    body = []
    for m in suite.methods:
        agg = m.aggregate(tasks)
        mean = aggregate_mean(m, tasks)
        have = sum(t in m.cells for t in tasks)
        agg_text = cell_text(agg, mean) if agg is not None and agg.n else \
            f"– ({pct(mean)} over tasks, no seed in all)" if mean is not None else \
            f"– ({have} of {len(tasks)} tasks)"
        body.append([m.label, m.hparams.get("state_size", ""),
                     *[cell_text(m.cells.get(t), settings=m.settings_done.get(t))
                       for t in tasks], agg_text])
    md += markdown_table(header, body)
    flagged = [f"- {m.label}, {t}: {m.cells[t].flags}" for m in suite.methods for t in tasks
               if t in m.cells and m.cells[t].flags]
    if flagged:
        md += ["", "## Flags (†), per method and task (runs at the best lr; each task's "
               "table.md flags them per row)", "", *flagged]
    md += ["", "## Best lr per task", "", *markdown_table(
        ["method", *tasks],
        [[m.label, *[lrs_text(m.cells[t].best_lrs) if t in m.cells else "–" for t in tasks]]
         for m in suite.methods])]
    names = list(dict.fromkeys(c["claim"] for rows_ in suite.claims.values() for c in rows_))
    if names:
        md += ["", "## Claims, seed by seed, per task (each side at its best lr on that task)",
               "", "Holds in k of n seeds, mean gap ± std in points (objective, better − worse); "
               "– : the task's study has not started.", ""]
        by_task = {t: {c["claim"]: c for c in rows_} for t, rows_ in suite.claims.items()}
        md += markdown_table(["claim", *tasks],
                             [[name, *[claim_text(by_task.get(t, {}).get(name)) for t in tasks]]
                              for name in names])
    return md


def suite_csv_rows(suite: Suite) -> tuple[list[dict[str, Any]], list[str]]:
    """table.csv's rows (one per method; fractions; empty where missing, and std for one
    seed; ``<task>_flags`` a cell's flags as table.md lists them) and its header."""
    fields = ["method", "feature_map", "mixers", "m", "state_size"]
    for name in [*suite.tasks, AGGREGATE]:
        fields += [f"{name}_mean", f"{name}_std", f"{name}_n"]
        fields += [f"{name}_best_lr", f"{name}_partial", f"{name}_flags"] \
            if name != AGGREGATE else []
    fields += ["tasks"]
    out = []
    for m in suite.methods:
        row: dict[str, Any] = {"method": m.label, "tasks": len(m.cells),
                               **{k: m.hparams.get(k) for k in fields[1:5]}}
        for t in suite.tasks:
            c = m.cells.get(t)
            row.update({f"{t}_mean": None, f"{t}_std": None, f"{t}_n": 0, f"{t}_best_lr": None,
                        f"{t}_partial": True if t in m.settings_done else None,
                        f"{t}_flags": None} if c is None else
                       {f"{t}_mean": c.mean, f"{t}_std": c.std if c.n > 1 else None,
                        f"{t}_n": c.n, f"{t}_best_lr": csv_lrs(c.best_lrs),
                        f"{t}_partial": c.partial, f"{t}_flags": c.flags})
        agg = m.aggregate(suite.tasks)
        row.update({f"{AGGREGATE}_mean": aggregate_mean(m, suite.tasks),
                    f"{AGGREGATE}_std": agg.std if agg is not None and agg.n > 1 else None,
                    f"{AGGREGATE}_n": agg.n if agg is not None else None})
        out.append(row)
    return out, fields


def csv_lrs(best_lrs: dict[str | None, float]) -> float | str:
    """A cell's best lr for table.csv: the number, or ``"a=0.003;b=0.001"`` per setting."""
    if list(best_lrs) == [None]:
        return best_lrs[None]
    return ";".join(f"{name}={lr:g}" for name, lr in best_lrs.items())


def write_suite(specs: list[SweepSpec], storage: Any, out: Path) -> list[Path]:
    """``out/table.md``, ``table.csv`` and ``heatmap.png`` of the suite of ``specs`` from
    ``storage`` (a study not in it counts as not started)."""
    check_suite(specs)
    known = set(optuna.get_all_study_names(storage))
    trials = {s.study: study_trials(s, storage) if s.study in known else None for s in specs}
    suite = build_suite(specs, trials)
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / "table.md"
    md_path.write_text("\n".join(suite_markdown(suite)) + "\n")
    csv_rows, fields = suite_csv_rows(suite)
    csv_path = write_csv(out / "table.csv", csv_rows, fields)
    values = []
    for m in suite.methods:
        agg = aggregate_mean(m, suite.tasks)
        values.append([100 * m.cells[t].mean if t in m.cells else math.nan for t in suite.tasks]
                      + [math.nan if agg is None else 100 * agg])
    plot = write_heatmap(values, [m.label for m in suite.methods], [*suite.tasks, AGGREGATE],
                         out / "heatmap.png", "task score % (mean over seeds)",
                         title="suite: each task at its best lr, and MAD's aggregate")
    return [md_path, csv_path, plot]
