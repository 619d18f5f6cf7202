"""Resolving ``best:<study>`` grid values to another study's checkpoints.

Grid values that point at another study's runs: ``best:<study>`` is the last checkpoint of
that study's run with this trial's seed, at the study's best learning rate (best mean over
seeds). A two-stage protocol (train BASED, then continue from it) uses it for
``model.init_from``; the other study must have finished and have one grid point. Where that
study trains one run per difficulty setting (``settings:``), the trial's own setting picks
among its runs (the same overlay name), so the referencing spec must list settings too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from sweeps.spec import SETTING, setting_name
from sweeps.trials import FINISHED, SEED, best_lr, by_point_and_lr, study_metric, valued_by

BEST = "best:"


class RefError(ValueError):
    """A ``best:`` reference that cannot be resolved yet (or at all); the message says why."""


def best_checkpoint(study_name: str, seed: Any, storage: Any, setting: str | None = None) -> str:
    """The last checkpoint of ``study_name``'s run with ``seed`` at its best lr (at
    ``setting``, an overlay path, where that study has settings)."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise RefError(f"best:{study_name}: no such study (run its sweep first)") from None
    trials = study.get_trials(deepcopy=False)
    metric = study_metric(study.user_attrs, trials)
    if metric is not None:
        trials = valued_by(trials, metric)
    if any(t.state not in FINISHED for t in trials):
        raise RefError(f"best:{study_name}: that study is still running")
    if any(SETTING in t.params for t in trials):
        if setting is None:
            raise RefError(f"best:{study_name}: that study trains one run per setting "
                           "(settings:); list the same settings in this spec")
        trials = [t for t in trials if SETTING in t.params
                  and setting_name(t.params[SETTING]) == setting_name(setting)]
        if not trials:
            raise RefError(f"best:{study_name}: no run at setting {setting_name(setting)}")
    points = by_point_and_lr(trials)
    if len(points) != 1:
        raise RefError(f"best:{study_name}: needs exactly one grid point besides seed and lr, "
                       f"found {len(points)}")
    (by_lr,) = points.values()
    best = best_lr(by_lr, study.direction == optuna.study.StudyDirection.MAXIMIZE)
    match = [t for t in by_lr[best] if t.params.get(SEED) == seed]
    if match and match[0].state == TrialState.PRUNED:
        raise RefError(f"best:{study_name}: its run with seed {seed} at its best lr {best:g} "
                       "was stopped by the pruner (run that study without one)")
    path = match[0].user_attrs.get("last_checkpoint") if match else None
    if not path:
        raise RefError(f"best:{study_name}: no finished run with seed {seed} at its best lr "
                       f"{best:g}")
    if not Path(path).is_file():
        raise RefError(f"best:{study_name}: the checkpoint of its seed-{seed} run, {path}, is "
                       "not on this machine (an archive keeps results, not checkpoints: run "
                       "this stage on the machine that has it)")
    return str(path)


def resolve_refs(params: dict[str, Any], storage: Any) -> dict[str, Any]:
    """``params`` with every ``best:<study>`` value replaced by :func:`best_checkpoint`."""
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, str) and value.startswith(BEST):
            out[key] = best_checkpoint(value[len(BEST):], params.get(SEED), storage,
                                       params.get(SETTING))
    return out


__all__ = ["BEST", "RefError", "best_checkpoint", "resolve_refs"]
