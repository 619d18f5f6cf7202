"""The table's rows: one per point at its best learning rate, mean ± std over its seeds.

For every point and lr, accuracy is averaged over seeds (:func:`sweeps.trials.by_point_and_lr`);
the lr with the best mean is the point's best lr, and the row reports mean ± std (sample std,
n seeds) there, per-slice means, state size and the paper's value where one matches
(``sweeps.paper``; a spec's ``settings:`` make a row per point and setting, whose
``hparams`` name the setting), with the protocol's flags: ``n_lrs`` (the point's lrs: the spec's
and every trial's, finished or not), ``converged`` (share of
the best lr's runs that converged, :mod:`arbench.curves`), collapsed and diverged runs at the
best lr (a diverged run counts at its best validation before it), failed grid points of the
point with no result (left out of their lr's mean), ``seeds`` (the study's seed count, flagged
when fewer ran at the best lr), whether the best lr sits at an edge of the point's lrs, and
``unfinished`` / ``not_started``: its runs waiting or running, and the spec's runs of it never
queued (the row is provisional while either is non-zero: its best lr may change). ``seed_values``
and ``seed_slices`` keep each seed's objective and per-slice accuracy there (the claims and
the suite's aggregate, :mod:`sweeps.report.suite`, read them).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from optuna.trial import TrialState

from arbench.curves import STOP_THRESHOLD, is_converged
from arbench.objective import EXAMPLE_ACC
from sweeps.paper import paper_value
from sweeps.report.labels import variant
from sweeps.spec import SETTING, SweepSpec, setting_name
from sweeps.trials import (
    LR,
    SEED,
    UNFINISHED,
    Trials,
    best_lr,
    by_point_and_lr,
    grid_point,
    objective_curve,
    point_key,
    run_value,
    unresolved_failures,
)

ROW_ORDER = ("feature_map", "p", "rank", "m", "r", "d_model")
"""Rows are sorted by these hparams."""


MQAR_SLICE = re.compile(r"L\d+_N\d+")
"""An MQAR test slice's name (``L64_N8``); the other recall tasks prefix theirs (``ow_…``,
:data:`arbench.data.tasks.TASKS`)."""


def mqar_slices(names: Iterable[str]) -> bool:
    """Whether every slice name is an MQAR slice's (also for runs recorded before tasks)."""
    return all(MQAR_SLICE.fullmatch(n) for n in names)


def run_converged(t: Any, metric: str) -> bool | None:
    """A run's convergence verdict on the study's objective: False for a run that diverged
    (cut short); for a completed run with a curve in ``metric``, :func:`arbench.curves.
    is_converged` of it, or True where its val/acc reached the early-stopping threshold (the
    profiles stop on val/acc, also where a study judges by zoology's metric, and a run stopped
    there has no last quarter to plateau in); else the verdict it recorded (the run's own
    ``converged`` is val/acc's; None: unknown, e.g. a pruned run)."""
    if t.user_attrs.get("diverged"):
        return False
    curve = objective_curve(t, metric) if t.state == TrialState.COMPLETE else []
    if not curve:
        return t.user_attrs.get("converged")
    acc = t.user_attrs.get("val_curve") or []  # a completed run's: val/acc's
    return is_converged(curve) or any(v >= STOP_THRESHOLD for _, v in acc)


def run_slices(t: Any, metric: str) -> dict[str, float]:
    """A run's per-slice accuracy in the objective's metric: zoology's per slice at its best
    validation of zoology's metric where the study judges by it (runs recorded before that metric
    kept token accuracy only), else val/acc's per slice at its best val/acc."""
    if metric.startswith(EXAMPLE_ACC) and t.user_attrs.get("example_slices"):
        return dict(t.user_attrs["example_slices"])
    return dict(t.user_attrs.get("slices") or {})


def planned_runs(spec: SweepSpec) -> dict[tuple, list[dict[str, Any]]]:
    """The spec's grid points (seed and lr included) by point (:func:`~sweeps.trials.
    point_key`): every run a grid sweep queues. Empty for a sampled sweep (it runs only the
    points its sampler picks) or a spec without a grid."""
    if getattr(spec, "sampler", "grid") != "grid" or not hasattr(spec, "points"):
        return {}
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for p in spec.points():
        out[point_key(p)].append(p)
    return out


def progress(spec: SweepSpec, trials: Trials) -> dict[tuple, dict[str, Any]]:
    """Per point: ``lrs``, the lrs it is to run (the spec's for it and every trial's grid-point
    lr, queued or failed included); ``unfinished``, its waiting and running trials;
    ``not_started``, the spec's grid points of it (seed and lr) with no trial at all; and
    ``failed``, its distinct grid points whose runs failed with neither a result nor a retry
    waiting or running (a point failed again after ``--retry-failed`` is one missing run)."""
    info: dict[tuple, dict[str, Any]] = defaultdict(
        lambda: {"lrs": set(), "unfinished": 0, "not_started": 0, "failed": 0})
    started = set()
    busy = set()
    for t in trials:
        gp = grid_point(t)
        started.add(point_key(gp, free=()))
        entry = info[point_key(gp)]
        if LR in gp:
            entry["lrs"].add(float(gp[LR]))
        if t.state in UNFINISHED:
            entry["unfinished"] += 1
            busy.add(point_key(gp, free=()))
    for point, planned in planned_runs(spec).items():
        entry = info[point]
        entry["lrs"].update(float(p[LR]) for p in planned if LR in p)
        entry["not_started"] += sum(point_key(p, free=()) not in started for p in planned)
    for key in {point_key(grid_point(t), free=()) for t in unresolved_failures(trials)} - busy:
        info[point_key(dict(key))]["failed"] += 1
    return info


def rows(spec: SweepSpec, trials: Trials) -> list[dict[str, Any]]:
    """One row per point of ``trials`` (the study's) at its best lr."""
    out = []
    maximize = spec.direction == "maximize"
    metric = spec.metric
    todo = progress(spec, trials)
    seeds = len({t.params.get(SEED) for t in trials if SEED in t.params})  # the study's
    for point, by_lr in by_point_and_lr(trials).items():
        best = best_lr(by_lr, maximize)
        state = todo[point]
        at_best = by_lr[best]
        values = [run_value(t, maximize) for t in at_best]
        hp = dict(next((t.user_attrs["hparams"] for ts in by_lr.values() for t in ts
                        if t.user_attrs.get("hparams")), {}))
        grid = dict(point)
        if SETTING in grid:  # a task's difficulty setting: its label and where: filters
            hp["setting"] = setting_name(grid[SETTING])
        slices: dict[str, list[float]] = defaultdict(list)
        for t in at_best:
            for name, acc in run_slices(t, metric).items():
                slices[name].append(acc)
        examples = [t.user_attrs["example_acc"] for t in at_best
                    if t.user_attrs.get("example_acc") is not None]
        tokens = [t.user_attrs["val_acc"] for t in at_best
                  if t.user_attrs.get("val_acc") is not None]
        verdicts = [run_converged(t, metric) for t in at_best]
        known = [bool(v) for v in verdicts if v is not None]
        lrs = sorted(state["lrs"] | set(by_lr))  # finished or not: a best lr may change
        out.append({
            "point": grid, "hparams": hp, "best_lr": best, "n_lrs": len(lrs),
            "lr_at_edge": len(lrs) > 1 and best in (lrs[0], lrs[-1]),
            "unfinished": state["unfinished"], "not_started": state["not_started"],
            "converged": sum(known) / len(known) if known else math.nan,
            "not_converged": len(known) - sum(known), "verdicts": len(known),
            "collapsed": sum(t.user_attrs.get("collapsed_at") is not None for t in at_best),
            "diverged": sum(bool(t.user_attrs.get("diverged")) for t in at_best),
            "failed": state["failed"], "seeds": seeds,
            "devices": sorted({str(t.user_attrs["device"]) for ts in by_lr.values() for t in ts
                               if t.user_attrs.get("device")}),
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values),
            "pruned": sum(t.state == TrialState.PRUNED for t in at_best),
            "lr_means": {lr: statistics.fmean(run_value(t, maximize) for t in ts)
                         for lr, ts in by_lr.items()},
            "seed_values": {t.params.get(SEED): run_value(t, maximize) for t in at_best},
            "seed_slices": {t.params.get(SEED): run_slices(t, metric) for t in at_best},
            "curves": [objective_curve(t, metric) for t in at_best], "curve_metric": metric,
            "log_dirs": [t.user_attrs.get("log_dir") for t in at_best],
            "loss_curves": [t.user_attrs.get("loss_curve") for t in at_best],
            "slices": {k: statistics.fmean(v) for k, v in sorted(slices.items())},
            "slice_values": {k: list(v) for k, v in sorted(slices.items())},
            "example_acc": examples, "token_acc": tokens,
            # the paper's: plain MQAR runs from scratch
            "paper": None if variant(hp) or not mqar_slices(slices) else paper_value(hp),
            "wall_time_s": sum(t.user_attrs.get("wall_time_s", 0.0) for ts in by_lr.values()
                               for t in ts),
        })
    out.sort(key=lambda r: tuple(str(r["hparams"].get(k, "")).zfill(6) for k in ROW_ORDER))
    return out
