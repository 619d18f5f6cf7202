"""A task's difficulty settings trained one run each (a spec's ``settings:``), merged per point.

A spec with ``settings:`` trains every grid point once per setting (MAD's protocol), so its
table has a row per point and setting, each at that setting's own best lr
(:func:`sweeps.report.rows.rows`). What the task asks of a point is the *task score*: for each
seed, the mean over the settings of that seed's run at each setting's best lr. :func:`task_rows`
merges a table's rows to one per point so: the spec's claims are checked on it
(:mod:`sweeps.report.table`), its plots against an hparam draw it (learning curves stay per
setting) and the suite's cells are made of it (:mod:`sweeps.report.suite`).
A spec without settings has one "setting" per point, its row, and the merge keeps it as it is.

Only a seed that has a value at every setting's best lr counts (a mean over fewer settings would
be another task's score); a point some of whose settings have no row yet has no task score.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sweeps.spec import SETTING, SweepSpec, setting_name
from sweeps.trials import point_key

RUN_FLAGS = ("collapsed", "diverged", "not_converged", "verdicts", "pruned", "failed")
"""A table row's counts of flagged runs (:func:`sweeps.report.rows.rows`), summed over a point's
settings in its task row."""


def row_setting(row: dict[str, Any]) -> str | None:
    """The setting a table row ran at (its overlay's name), None for a spec without settings."""
    path = row["point"].get(SETTING)
    return None if path is None else setting_name(path)


def slice_scores(row: dict[str, Any]) -> dict[Any, float]:
    """``{seed: mean accuracy over the run's test slices}`` at the row's best lr (the suite's
    score of one run: MAD's mean over a task's test settings), for seeds with slices."""
    return {seed: statistics.fmean(slices.values())
            for seed, slices in row["seed_slices"].items() if slices}


def _per_seed(members: list[dict[str, float]]) -> dict[Any, float]:
    """The mean over ``members`` (one ``{seed: value}`` per setting) of each seed they all have."""
    if not members:
        return {}
    seeds = set.intersection(*(set(m) for m in members))
    return {s: statistics.fmean(m[s] for m in members) for s in sorted(seeds, key=str)}


def task_rows(spec: SweepSpec, table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point less its setting, in the table's order: ``point`` and ``hparams`` (no
    setting; the state size of the spec's first setting that has a row, which may depend on
    the sequence length),
    ``seed_values`` (the objective) and ``seed_scores`` (:func:`slice_scores`), each the mean
    over the spec's settings per seed, with ``mean``, ``std`` (sample) and ``n`` over the
    seeds of ``seed_values``; ``slice_values`` (each setting's slices: one setting tests each);
    ``best_lrs`` (``{setting: best lr}``, key None without settings), ``settings_done`` and
    ``settings`` (how many of the spec's settings have a row), and ``short_of_seeds``: every
    setting has a row but no seed has run at every setting's best lr (yet); ``unfinished`` and
    ``not_started``: the settings' rows' counts summed (a provisional row); the protocol's
    flags of the settings' runs at their best lrs: :data:`RUN_FLAGS` summed, ``lr_at_edge``
    (any setting's), ``seeds`` (the study's). Incomplete points,
    and those short of seeds, keep empty ``seed_values`` and ``seed_scores`` (``n`` 0, ``mean``
    and ``std`` nan)."""
    wanted = [setting_name(p) for p in spec.settings] or [None]
    groups: dict[tuple, dict[str | None, dict[str, Any]]] = {}
    for row in table:
        key = point_key(row["point"], free=(SETTING,))
        groups.setdefault(key, {})[row_setting(row)] = row
    out = []
    for key, by_setting in groups.items():
        members = [by_setting[name] for name in wanted if name in by_setting]
        complete = len(members) == len(wanted)
        first = members[0] if members else next(iter(by_setting.values()))
        values = _per_seed([m["seed_values"] for m in members]) if complete else {}
        out.append({
            "point": dict(key),
            "hparams": {k: v for k, v in first["hparams"].items() if k != "setting"},
            "seed_values": values, "n": len(values),
            "mean": statistics.fmean(values.values()) if values else math.nan,
            "std": statistics.stdev(values.values()) if len(values) > 1 else
            (0.0 if values else math.nan),
            "slice_values": {k: v for m in members for k, v in m["slice_values"].items()},
            "seed_scores": _per_seed([slice_scores(m) for m in members]) if complete else {},
            "best_lrs": {row_setting(m): m["best_lr"] for m in members},
            "settings_done": len(members), "settings": len(wanted),
            "short_of_seeds": complete and len(wanted) > 1 and not values,
            "unfinished": sum(int(m.get("unfinished") or 0) for m in by_setting.values()),
            "not_started": sum(int(m.get("not_started") or 0) for m in by_setting.values()),
            **{k: sum(int(m.get(k) or 0) for m in members) for k in RUN_FLAGS},
            "lr_at_edge": any(m.get("lr_at_edge") for m in members),
            "seeds": max((int(m.get("seeds") or 0) for m in members), default=0),
        })
    return out


def lrs_text(best_lrs: dict[str | None, float]) -> str:
    """``"0.003"`` for one setting; ``"a 0.003, b 0.001"`` for several (setting, best lr)."""
    if list(best_lrs) == [None]:
        return f"{best_lrs[None]:g}"
    return ", ".join(f"{name} {lr:g}" for name, lr in best_lrs.items())
