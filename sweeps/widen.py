"""Widening a point's lr sub-grid where its best lr sits at an edge (``run --widen N``).

A grid point whose trials have all finished and whose best lr (mean over seeds) is the lowest
or the highest lr tried (failed runs' lrs included) gets one more lr beyond that edge, a step
as wide as the last one (``lr_edge² / lr_next``, e.g. 9e-5 below {3e-4, 1e-3, 3e-3}), for
each seed that ran at the best lr. At most ``max_added`` lrs are added on each side of the
spec's own lrs, counting every lr a point has tried, and an lr it has tried once is never
queued again (a widened lr whose runs all failed ends the widening there, where it would
otherwise be queued on every round). The rule is the same for every point, so no method
gets a wider search than another unless its own results ask for it; ``python -m sweeps run
SPEC --widen N`` applies it until no point is at an edge (or each has N added lrs there).

Grid numbers are recorded with one-value int/float distributions
(:func:`sweeps.params.fixed_distribution`), which Optuna lets differ between trials, so a
study can gain lrs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import optuna
from optuna.storages import RDBStorage

from sweeps.queue import enqueue, queue_lock
from sweeps.spec import SweepSpec
from sweeps.trials import (
    LR,
    UNFINISHED,
    best_lr,
    by_point_and_lr,
    grid_point,
    point_key,
    valued_by,
)


def next_lr(lrs: list[float], low: bool) -> float:
    """One geometric step beyond the low (or high) end of the sorted ``lrs``, 3 digits."""
    edge, inner = (lrs[0], lrs[1]) if low else (lrs[-1], lrs[-2])
    return float(f"{edge * edge / inner:.3g}")


def widened_points(study: optuna.Study, spec: SweepSpec, max_added: int) -> list[dict[str, Any]]:
    """The trials (grid values with seed and lr) that widen every finished point whose best lr
    is at an edge of the lrs it tried."""
    trials = valued_by(study.get_trials(deepcopy=False), spec.metric)
    busy = {point_key(grid_point(t)) for t in trials if t.state in UNFINISHED}
    tried: dict[tuple, set[float]] = defaultdict(set)
    for t in trials:
        tried[point_key(grid_point(t))].add(grid_point(t).get(LR))
    queued = []
    for point, by_lr in by_point_and_lr(trials).items():
        # the edges of every lr tried, failed ones too: an inner lr whose runs all failed
        # neither makes its neighbour an edge nor widens the step beyond it
        lrs = sorted(lr for lr in tried[point] if lr is not None)
        if point in busy or len(by_lr) < 2:
            continue
        best = best_lr(by_lr, spec.direction == "maximize")
        if best not in (lrs[0], lrs[-1]):
            continue
        low = best == lrs[0]
        beyond = [lr for lr in tried[point] if lr is not None
                  and (lr < min(spec.lr) if low else lr > max(spec.lr))]
        new = next_lr(lrs, low)
        if len(beyond) >= max_added or new in tried[point]:
            continue
        queued += [{**grid_point(t), LR: new} for t in by_lr[best]]
    return queued


def widen(spec: SweepSpec, storage: RDBStorage, max_added: int) -> list[dict[str, Any]]:
    """Queue :func:`widened_points` (under the grid's queue lock; a run a ``reuse:`` study has
    is recorded from it); returns the widened points."""
    with queue_lock(storage, spec.study):
        study = optuna.load_study(study_name=spec.study, storage=storage)
        points = widened_points(study, spec, max_added)
        enqueue(study, spec, storage, points)
    return points
