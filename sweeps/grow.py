"""Adding the grid values a spec gained after its study began to the recorded choices.

A study whose spec gains grid values after its first trials (e.g. a third config).

Optuna fixes a categorical param's choices per study: a trial may only record a config path
with the exact choice list the study's first trial recorded it with, so a spec that adds a
config to a running study's grid would fail its first new trial ("CategoricalDistribution does
not support dynamic value space"). :func:`extend_categorical_params` rewrites every recorded
trial's distribution of such a param to the old choices followed by the new ones, keeping each
trial's value, so that the new values can be queued. Numbers need no rewrite: they are
recorded with one-value distributions (:func:`sweeps.params.fixed_distribution`).
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages import RDBStorage

from sweeps.recorded_params import rewrite_params


def extend_categorical_params(storage: RDBStorage, study_name: str,
                              choices: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Append to each categorical param the study has recorded the values of ``choices`` (the
    spec's, per param) that its choice list lacks, in every trial of the study; returns the
    values added per param (empty: nothing rewritten)."""
    added: dict[str, list[Any]] = {}

    def extended(name: str, dist: BaseDistribution, value: Any) -> BaseDistribution | None:
        # Optuna records one choice list per categorical param and study, so every row of
        # ``name`` gets the same extension.
        if not isinstance(dist, CategoricalDistribution) or name not in choices:
            return None
        missing = [v for v in choices[name] if v not in dist.choices]
        if not missing:
            return None
        added[name] = missing
        return CategoricalDistribution([*dist.choices, *missing])

    rewrite_params(storage, study_name, extended)
    return added
