"""Rewriting the distributions a study's trials recorded their params with, keeping each value.

Optuna checks a trial's params against the distributions earlier trials recorded; a grid
that gains a categorical value (:mod:`sweeps.grow`) changes those distributions in place in
an RDB storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import BaseDistribution, distribution_to_json, json_to_distribution
from optuna.storages import RDBStorage
from optuna.storages._rdb.models import TrialModel, TrialParamModel

Rewrite = Callable[[str, BaseDistribution, Any], BaseDistribution | None]


def rewrite_params(storage: RDBStorage, study_name: str, rewrite: Rewrite) -> int:
    """Call ``rewrite(param_name, distribution, value)`` (``value`` as the trial sees it) for
    every param of every trial of the study and record the param with the distribution it
    returns and the same value (None: leave the row as it is); one transaction. Returns how
    many rows were rewritten."""
    study_id = storage.get_study_id_from_name(study_name)
    session = storage.scoped_session()
    changed = 0
    try:
        rows = (session.query(TrialParamModel).join(TrialModel)
                .filter(TrialModel.study_id == study_id).all())
        for row in rows:
            old = json_to_distribution(row.distribution_json)
            value = old.to_external_repr(row.param_value)
            new = rewrite(row.param_name, old, value)
            if new is None:
                continue
            row.distribution_json = distribution_to_json(new)
            row.param_value = new.to_internal_repr(value)
            changed += 1
        session.commit()
    finally:
        session.close()
    return changed
