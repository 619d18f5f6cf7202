"""Pure records of a study's trials: states, grid points and their keys, best lr, lock names.

A *grid point* is the values a trial was queued with (``fixed_params``). A *point* in the
tables is a grid point less :data:`VARYING` (seed and lr): for every point and lr, accuracy is
averaged over seeds, and the lr with the best mean is the point's best lr. Nothing here reads
or writes a storage; every function takes trials already loaded.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from arbench.objective import ACC, EXAMPLE_ACC, summary_value

Trial = optuna.trial.FrozenTrial
Trials = list[optuna.trial.FrozenTrial]

LR = "model.lr"
SEED = "seed_everything"
VARYING = (SEED, LR)
"""The grid keys a point varies over: its rows average over seeds at its best lr."""

FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
"""Trials that will not run again."""
UNFINISHED = (TrialState.WAITING, TrialState.RUNNING)
"""Trials queued or running: a point with one is busy."""
RESULTS = (TrialState.COMPLETE, TrialState.PRUNED)
"""Trials that hold a result (a pruned run counts with the best it had reached)."""
OPEN = (*RESULTS, *UNFINISHED)
"""Trials that stand for their point: it needs no retry."""
STATE_NAMES = ("complete", "running", "waiting", "fail", "pruned")
"""The states as the status lines and the run summary count them, in that order."""

LOCK_PREFIX = "_arbench_lock::"
"""Queueing-lock studies are named ``<LOCK_PREFIX><study>``; one exists only while a process
queues."""


def lock_study_name(study_name: str) -> str:
    """The name of ``study_name``'s queueing-lock study."""
    return f"{LOCK_PREFIX}{study_name}"


def is_lock_study(name: str) -> bool:
    """A queueing lock, not a user's study."""
    return name.startswith(LOCK_PREFIX)


def is_number(value: Any) -> bool:
    """An int or float grid value (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def grid_point(trial: Trial) -> dict[str, Any]:
    """The grid point a trial runs (queued as ``fixed_params``)."""
    return trial.system_attrs.get("fixed_params") or trial.params


def point_values(params: dict[str, Any], free: Iterable[str] = VARYING) -> dict[str, str]:
    """``params`` less the keys in ``free``, the values as strings."""
    free = tuple(free)
    return {k: str(v) for k, v in params.items() if k not in free}


def point_key(params: dict[str, Any], free: Iterable[str] = VARYING) -> tuple:
    """The key trials are grouped by: :func:`point_values` as a sorted tuple. ``free`` names
    the keys that do not tell groups apart: seed and lr for a table's point, the lr alone for
    a pruning bracket, none for a grid point."""
    return tuple(sorted(point_values(params, free).items()))


def state_counts(trials: Trials) -> dict[str, int]:
    """``{complete, running, waiting, fail, pruned: count}`` of ``trials``."""
    counts = Counter(t.state.name.lower() for t in trials)
    return {k: counts.get(k, 0) for k in STATE_NAMES}


def study_metric(user_attrs: dict[str, Any], trials: Trials) -> str | None:
    """The objective a study's runs were valued by, from its user attrs and trials: the
    ``metric`` :func:`sweeps.study.make_study` records; for a study begun before it did, the one
    of ``val/acc`` and zoology's metric whose recorded value equals the value of every
    completed run the study trained (None when neither or both do)."""
    named = user_attrs.get("metric")
    if named:
        return str(named)
    trained = [t for t in trials
               if t.state == TrialState.COMPLETE and not t.user_attrs.get("reused_from")]
    fits = [metric for metric in (ACC, EXAMPLE_ACC) if trained and all(
        summary_value(t.user_attrs, metric) == t.value for t in trained)]
    return fits[0] if len(fits) == 1 else None


def valued_by(trials: Trials, metric: str) -> Trials:
    """``trials`` with every completed run recorded from another study's run (``reused_from``)
    valued by ``metric`` as that run recorded it. Before sweeps.reuse valued reused runs by the
    reusing study's objective, such a run kept its source study's value, which may be another
    metric (``bf16_parity_long``'s and ``long_p_ablation``'s runs from ``calibration_long_6k``:
    ``val/acc`` where theirs is zoology's). Runs trained by the study are left as they are."""
    out = []
    for t in trials:
        if t.state == TrialState.COMPLETE and t.user_attrs.get("reused_from"):
            value = summary_value(t.user_attrs, metric)
            if value is not None and value != t.value:
                t = copy.copy(t)
                t.value = value
        out.append(t)
    return out


CURVES = {ACC: "val_curve", EXAMPLE_ACC: "example_curve"}
"""The user attr holding a completed run's whole curve of each metric ((step, value) pairs,
from its ``summary.json``; ``example_curve`` only in runs recorded since 2026-12-06)."""


def objective_curve(t: Trial, metric: str) -> list[tuple[int, float]]:
    """A run's validations in ``metric``, (step, value) pairs by step: its intermediate values
    where it has them (a study with a pruner reports the objective at every validation),
    else the curve of that metric its ``summary.json`` recorded (:data:`CURVES`; a completed
    run's ``val_curve`` is always ``val/acc``'s); empty when it has neither (a run from before
    ``example_curve``, judged by zoology's metric)."""
    if t.intermediate_values:
        return sorted((int(s), v) for s, v in t.intermediate_values.items())
    key = CURVES.get(metric)
    return [(int(s), v) for s, v in (t.user_attrs.get(key) or [])] if key else []


def run_value(t: Trial, maximize: bool = True) -> float:
    """A run's objective: its value when it completed; for a run the pruner stopped, the
    best it had reached (its best intermediate value), as :mod:`sweeps.halving` counts it."""
    if t.state == TrialState.PRUNED:
        reached = t.intermediate_values.values()
        return max(reached) if maximize else min(reached)
    return t.value


def by_point_and_lr(trials: Trials) -> dict[tuple, dict[float, Trials]]:
    """Finished ``trials`` (completed, or pruned after at least one validation) grouped by
    point (:func:`point_key`), then by lr. A pruned run stays in its lr's group, counted by
    :func:`run_value`: leaving it out would average that lr over only the seeds that survived
    halving. A seed with two finished runs at one point and lr counts once, by the run
    :func:`seed_run` picks (runs.csv keeps both)."""
    grouped: dict[tuple, dict[float, Trials]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED
                                              and t.intermediate_values):
            grouped[point_key(t.params)][t.params.get(LR, 0.0)].append(t)
    for by_lr in grouped.values():
        for lr, runs in by_lr.items():
            by_lr[lr] = one_run_per_seed(runs)
    return grouped


def seed_run(runs: Trials) -> optuna.trial.FrozenTrial:
    """Of one seed's finished runs at one point and lr, the one that counts: a completed run
    before a pruned one (it ran its whole budget), then the latest (highest trial number)."""
    return max(runs, key=lambda t: (t.state == TrialState.COMPLETE, t.number))


def one_run_per_seed(runs: Trials) -> Trials:
    """``runs`` (one point and lr) with each seed's duplicates replaced by :func:`seed_run`'s
    pick, in trial order; runs without a seed are all kept."""
    by_seed: dict[Any, Trials] = defaultdict(list)
    for t in runs:
        if SEED in t.params:
            by_seed[t.params[SEED]].append(t)
    kept = {id(seed_run(same)) for same in by_seed.values()}
    return [t for t in runs if SEED not in t.params or id(t) in kept]


def best_lr(by_lr: dict[float, Trials], maximize: bool = True) -> float:
    """The lr whose trials have the best mean objective (over seeds, :func:`run_value`); of
    lrs that tie exactly (every run at 100 %), the one nearest the middle of the lrs tried, so
    a tie never puts the best lr at a grid edge (nor widens the grid there)."""
    return best_of_means({lr: statistics.fmean(run_value(t, maximize) for t in runs)
                          for lr, runs in by_lr.items()}, maximize)


def best_of_means(means: dict[float, float], maximize: bool = True) -> float:
    """The lr of the best mean objective in ``means`` (``{lr: mean}``); of lrs that tie
    exactly, the one nearest the middle of the lrs (:func:`best_lr`'s rule)."""
    sign = 1 if maximize else -1
    top = max(sign * m for m in means.values())
    order = sorted(means)
    middle = (len(order) - 1) / 2
    return min((lr for lr in order if sign * means[lr] == top),
               key=lambda lr: (abs(order.index(lr) - middle), lr))


def beyond_grid(lr: Any, grid_lrs: Sequence[float] | None) -> bool:
    """Whether ``lr`` lies outside a spec's ``lr:`` sub-grid ``grid_lrs`` (an lr ``--widen``
    added), which the grid's pruner never stops; False without a sub-grid or an lr."""
    return grid_lrs is not None and lr is not None and not any(
        math.isclose(float(lr), float(g), rel_tol=1e-9) for g in grid_lrs)


def unresolved_failures(trials: Trials) -> Trials:
    """Failed trials whose grid point (seed and lr included) has no result: runs that are
    missing from their lr's mean until a retry gives them one."""
    done = {point_key(grid_point(t), free=()) for t in trials if t.state in RESULTS}
    return [t for t in trials if t.state == TrialState.FAIL
            and point_key(grid_point(t), free=()) not in done]


def retried_numbers(trials: Trials) -> set[int]:
    """The numbers of the trials another trial retries: Optuna's stale-trial retry names the
    first trial of its chain in ``failed_trial`` and every one in ``retry_history``;
    ``--retry-failed`` names the trial it replaces in ``failed_trial``. Values that are not
    trial numbers are skipped."""
    numbers: set[int] = set()
    for t in trials:
        history = t.system_attrs.get("retry_history")
        named = [t.system_attrs.get("failed_trial"), *(history if isinstance(history, list)
                                                       else [])]
        numbers.update(n for n in named
                       if isinstance(n, int) and not isinstance(n, bool) and n != t.number)
    return numbers


def counted_runs(trials: Trials) -> Trials:
    """The trials a sampled (not grid) sweep counts towards its ``n_trials``: every trial but
    a failed one that another trial retries (:func:`retried_numbers`), so a killed run and its
    retry count once, and the retry still runs."""
    retried = retried_numbers(trials)
    return [t for t in trials if not (t.state == TrialState.FAIL and t.number in retried)]


def failed_points(trials: Trials) -> Trials:
    """The latest failed trial of every grid point that has failed and has no trial complete,
    pruned, running or waiting: the points a ``--retry-failed`` run queues again."""
    by_point: dict[tuple, Trials] = {}
    for trial in trials:
        by_point.setdefault(point_key(grid_point(trial), free=()), []).append(trial)
    return [max((t for t in group if t.state == TrialState.FAIL), key=lambda t: t.number)
            for group in by_point.values()
            if not any(t.state in OPEN for t in group)
            and any(t.state == TrialState.FAIL for t in group)]
