"""Successive halving over the lr sub-grid, replayed on a finished grid: ``halving.md``.

Every completed run keeps its validation curves (``val_curve``, (step, val/acc) pairs, and
``example_curve`` for zoology's metric; the one of the study's objective is replayed,
:func:`~sweeps.trials.objective_curve`). For each
grid point and seed, the runs at the point's lrs form one bracket, fed in trial order (as one
worker would have run them) to Optuna's ``SuccessiveHalvingPruner``: each validation is reported
and the pruner asked, exactly as a live sweep with ``pruner: halving`` asks it, but only against
the runs of the same point and seed, never another point's. A pruned run counts with the best
val/acc it had reached. The point's lr under halving is the lr with the best mean over seeds of
those values; :func:`replay` says whether it is the full grid's best lr and how many training
steps halving would have spent. :func:`order_checks` replays it under every order of the lrs
within a bracket, since a live sweep's order changes with retries and parallel workers.

Defaults: ``reduction_factor=3`` and ``min_resource`` half the longest run's steps (1500 at the
``cpu`` profile's 3000: one rung). Optuna decides each run as it reaches the rung, against the
bracket's runs that reached it before: the first is always kept, a later one is stopped unless
it is in the top third of the values so far. So which lrs survive depends on the order the
runs arrive in (a bracket of three keeps one to three of them; its best at the rung is always
kept), in a live sweep as in this replay. A study whose pruner
ran live has no whole curves to replay, and a point of one lr nothing to halve: the report
writes ``halving.md`` only for a study run without a pruner, and only over its points of two
or more lrs.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from arbench.objective import ACC
from arbench.tables import markdown_row, markdown_table
from sweeps.trials import (
    LR,
    SEED,
    Trials,
    best_lr,
    best_of_means,
    beyond_grid,
    by_point_and_lr,
    objective_curve,
)


@dataclass
class PointReplay:
    """One grid point: best lr of the full grid and under halving, steps of each, and the
    step each pruned run stopped at (``{(lr, seed): step}``)."""

    point: tuple
    best_full: float
    best_halving: float
    steps_full: int
    steps_halving: int
    pruned: dict[tuple[float, Any], int]


def with_curves(trials: Trials, metric: str = ACC) -> Trials:
    """The completed ``trials`` that kept their whole curve of ``metric`` (what a replay can
    use: :func:`~sweeps.trials.objective_curve`)."""
    return [t for t in trials
            if t.state == TrialState.COMPLETE and objective_curve(t, metric)]


def longest_run(trials: Trials) -> int:
    """The most training steps any of ``trials`` ran."""
    return max((int(t.user_attrs.get("global_step") or 0) for t in trials), default=0)


def halving_args(trials: Trials) -> dict[str, Any]:
    """The replay's pruner arguments: reduction factor 3, one rung at half the longest run."""
    return {"reduction_factor": 3, "min_resource": max(1, longest_run(trials) // 2)}


def replay_bracket(runs: Trials, direction: str, args: dict[str, Any],
                   metric: str = ACC, grid_lrs: Sequence[float] | None = None,
                   ) -> dict[int, tuple[float, int, bool]]:
    """Feed ``runs`` (one point and seed, trial order) to a fresh halving pruner, each run's
    curve of ``metric`` (the study's objective, its value's metric); a run at an lr beyond
    ``grid_lrs`` runs whole, as live; returns ``{trial number: (value reached, steps spent,
    pruned)}``."""
    study = optuna.create_study(direction=direction,
                                pruner=optuna.pruners.SuccessiveHalvingPruner(**args))
    out = {}
    for run in runs:
        live = study.ask()
        best, steps, pruned = None, int(run.user_attrs.get("global_step") or 0), False
        whole = beyond_grid(run.params.get(LR), grid_lrs)
        for step, value in ([] if whole else objective_curve(run, metric)):
            best = value if best is None else (max(best, value) if direction == "maximize"
                                               else min(best, value))
            live.report(value, int(step))
            if live.should_prune():
                steps, pruned = int(step), True
                break
        if pruned:
            study.tell(live, state=TrialState.PRUNED)
            out[run.number] = (best, steps, True)
        else:
            study.tell(live, run.value)
            out[run.number] = (run.value, steps, False)
    return out


def replay(trials: Trials, direction: str = "maximize", args: dict[str, Any] | None = None,
           order: dict[float, int] | None = None, metric: str = ACC,
           grid_lrs: Sequence[float] | None = None) -> list[PointReplay]:
    """:class:`PointReplay` for every point of the completed ``trials`` that kept curves;
    ``args``: the pruner's (default :func:`halving_args`); ``order``: the rank of
    each lr within a bracket (default: the runs' trial order; an lr it lacks goes last);
    ``grid_lrs``: the spec's lrs, beyond which a run is never stopped (:func:`beyond_grid`)."""
    done = with_curves(trials, metric)
    args = args or halving_args(done)
    maximize = direction == "maximize"
    out = []
    for point, by_lr in by_point_and_lr(done).items():
        if len(by_lr) < 2:
            continue  # one lr: nothing to halve
        brackets: dict[Any, Trials] = defaultdict(list)
        for runs in by_lr.values():
            for t in runs:
                brackets[t.params.get(SEED)].append(t)
        reached: dict[int, tuple[float, int, bool]] = {}
        for runs in brackets.values():
            key = (lambda t: t.number) if order is None else \
                (lambda t: (order.get(t.params.get(LR), len(order)), t.number))
            reached |= replay_bracket(sorted(runs, key=key), direction, args, metric, grid_lrs)
        means = {lr: statistics.fmean(reached[t.number][0] for t in runs)
                 for lr, runs in by_lr.items()}
        out.append(PointReplay(
            point=point, best_full=best_lr(by_lr, maximize),
            best_halving=best_of_means(means, maximize),
            steps_full=sum(int(t.user_attrs.get("global_step") or 0)
                           for runs in by_lr.values() for t in runs),
            steps_halving=sum(v[1] for v in reached.values()),
            pruned={(lr, t.params.get(SEED)): reached[t.number][1]
                    for lr, runs in by_lr.items() for t in runs if reached[t.number][2]}))
    return out


@dataclass
class OrderCheck:
    """Replays of one ``min_resource`` under every order of the lrs within a bracket: per
    order, the points whose best lr halving kept, and the share of training steps spent."""

    min_resource: int
    kept: list[int]
    spent: list[float]
    points: int


MAX_ORDERS = 120
"""At most this many lr orders are replayed (every order of up to 5 lrs)."""


def lr_orders(lrs: list[float]) -> list[tuple[float, ...]]:
    """Every order of ``lrs``; of more than :data:`MAX_ORDERS`, that many distinct ones drawn
    at random (seeded), not the first in lexicographic order, which all run the lowest lrs
    first."""
    if math.factorial(len(lrs)) <= MAX_ORDERS:
        return list(itertools.permutations(lrs))
    rng, orders = random.Random(0), {}
    while len(orders) < MAX_ORDERS:
        orders.setdefault(tuple(rng.sample(lrs, len(lrs))), None)
    return list(orders)


def order_checks(trials: Trials, direction: str, args: dict[str, Any],
                 fractions: tuple[float, ...] = (1 / 6, 1 / 3, 1 / 2),
                 metric: str = ACC, grid_lrs: Sequence[float] | None = None,
                 ) -> list[OrderCheck]:
    """Halving replayed with its first rung at each of ``fractions`` of the longest run, under
    every order of the lrs within a bracket. In a live sweep the order is the order runs reach
    each rung, which retries and parallel workers change; a setting whose best lr depends on
    it is not one to trust. Runs beyond ``grid_lrs`` never compete, so only the grid's lrs
    are ordered."""
    done = with_curves(trials, metric)
    longest = longest_run(done)
    lrs = sorted({t.params.get(LR) for t in done} - {None}, key=float)
    orders = lr_orders([lr for lr in lrs if not beyond_grid(lr, grid_lrs)])
    out = []
    for fraction in fractions:
        step_args = {**args, "min_resource": max(1, int(longest * fraction))}
        kept, spent = [], []
        for perm in orders:
            replays = replay(done, direction, step_args, {lr: i for i, lr in enumerate(perm)},
                             metric, grid_lrs)
            kept.append(sum(r.best_full == r.best_halving for r in replays))
            spent.append(sum(r.steps_halving for r in replays) /
                         max(1, sum(r.steps_full for r in replays)))
        out.append(OrderCheck(step_args["min_resource"], kept, spent, len(replays)))
    return out


def order_text(checks: list[OrderCheck]) -> list[str]:
    """Markdown: one row per first-rung step."""
    if not checks:
        return []
    lines = ["", "## Does the order of the lrs matter?", "",
             f"The same replay under every order of the lrs within each bracket "
             f"({len(checks[0].kept)} orders), with the first rung at several steps.", "",
             *markdown_table(["first rung (step)", "points keeping their best lr, per order",
                              "orders keeping all", "steps spent"])]
    for c in checks:
        lines.append(markdown_row([
            c.min_resource, f"{', '.join(str(k) for k in c.kept)} (of {c.points})",
            f"{sum(k == c.points for k in c.kept)} of {len(c.kept)}",
            f"{100 * min(c.spent):.0f}–{100 * max(c.spent):.0f}%"]))
    return lines


def halving_text(replays: list[PointReplay], args: dict[str, Any],
                 metric: str = ACC) -> list[str]:
    """Markdown: one row per point, then the totals."""
    lines = [f"Successive halving replayed on each point's lr sub-grid, one bracket per seed "
             f"(`sweeps/halving.py`; {', '.join(f'{k}={v}' for k, v in sorted(args.items()))})."
             f" A run stopped by the pruner counts with the best {metric} it had reached.", "",
             *markdown_table(["point", "best lr (full grid)", "best lr (halving)", "same",
                              "steps full", "steps halving", "runs stopped (lr, seed @ step)"])]
    for r in replays:
        name = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in r.point) or "all"
        stopped = "; ".join(f"{lr:g}, {seed} @ {step}" for (lr, seed), step in
                            sorted(r.pruned.items()))
        lines.append(markdown_row([name, f"{r.best_full:g}", f"{r.best_halving:g}",
                                   "yes" if r.best_full == r.best_halving else "**no**",
                                   r.steps_full, r.steps_halving, stopped or "-"]))
    full = sum(r.steps_full for r in replays)
    kept = sum(r.best_full == r.best_halving for r in replays)
    if full:
        spent = sum(r.steps_halving for r in replays)
        lines += ["", f"Same best lr at {kept} of {len(replays)} points; halving spends "
                      f"{spent} of {full} training steps ({100 * spent / full:.0f}%)."]
    return lines


def write_halving(spec: Any, trials: Trials, out: Any) -> list[Any]:
    """``halving.md`` beside the study's table when a point tried more than one lr and no
    pruner ran live (a replay needs every run's whole curve); points of one lr are left out."""
    if getattr(spec, "pruner", "none") != "none":
        return []
    metric = spec.metric
    done = with_curves(trials, metric)
    if all(len(by_lr) < 2 for by_lr in by_point_and_lr(done).values()):
        return []
    args = halving_args(done)
    grid_lrs = getattr(spec, "lr", None) or None  # --widen's lrs beyond it run whole
    path = out / "halving.md"
    path.write_text("\n".join([
        "# Successive halving on the lr sub-grid", "",
        *halving_text(replay(done, spec.direction, args, metric=metric, grid_lrs=grid_lrs),
                      args, metric),
        *order_text(order_checks(done, spec.direction, args, metric=metric,
                                 grid_lrs=grid_lrs))]) + "\n")
    return [path]
