"""A study whose spec gains grid values after its first trials (e.g. a third config).

Optuna fixes a categorical param's choices per study: a trial may only record a config path
with the exact choice list the study's first trial recorded it with, so a spec that adds a
config to a running study's grid would fail its first new trial ("CategoricalDistribution does
not support dynamic value space"). :func:`extend_categorical_params` rewrites every recorded
trial's distribution of such a param to the old choices followed by the new ones, keeping each
trial's value, so that the new values can be queued. Numbers need no rewrite: they are
recorded with one-value distributions (:func:`sweeps.worker.fixed_distribution`).
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import CategoricalDistribution, distribution_to_json, json_to_distribution
from optuna.storages import RDBStorage


def extend_categorical_params(storage: RDBStorage, study_name: str,
                              choices: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Append to each categorical param the study has recorded the values of ``choices`` (the
    spec's, per param) that its choice list lacks, in every trial of the study; returns the
    values added per param (empty: nothing rewritten)."""
    from optuna.storages._rdb.models import TrialModel, TrialParamModel

    study_id = storage.get_study_id_from_name(study_name)
    session = storage.scoped_session()
    added: dict[str, list[Any]] = {}
    try:
        rows = (session.query(TrialParamModel).join(TrialModel)
                .filter(TrialModel.study_id == study_id).all())
        recorded: dict[str, CategoricalDistribution] = {}
        for row in rows:
            dist = json_to_distribution(row.distribution_json)
            if isinstance(dist, CategoricalDistribution) and row.param_name in choices:
                recorded.setdefault(row.param_name, dist)
        for name, dist in recorded.items():
            missing = [v for v in choices[name] if v not in dist.choices]
            if missing:
                added[name] = missing
        for row in rows:
            if row.param_name not in added:
                continue
            old = json_to_distribution(row.distribution_json)
            value = old.to_external_repr(row.param_value)
            new = CategoricalDistribution([*old.choices, *added[row.param_name]])
            row.distribution_json = distribution_to_json(new)
            row.param_value = new.to_internal_repr(value)
        session.commit()
    finally:
        session.close()
    return added
