"""Grid values as Optuna params: their distributions, and the checks a queued point passes.

Numbers get a one-value int or float distribution, which Optuna lets differ between trials, so
a study can later gain lrs or seeds (:mod:`sweeps.widen`); other values (config paths) are
categorical over the spec's values (a grid that gains one: :mod:`sweeps.grow`).
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import RDBStorage

from sweeps.spec import SweepSpec
from sweeps.trials import is_number


def fixed_distribution(value: Any, options: list[Any],
                       recorded: BaseDistribution | None) -> BaseDistribution:
    """The distribution a queued grid value is recorded with: a one-value int or float
    distribution for a number, else categorical over ``options`` (the spec's values).
    ``recorded``: the key's distribution in the study so far, if any. A key recorded as
    categorical keeps its recorded choices (Optuna fixes them per study), numbers included:
    a key whose values mix numbers and text is categorical once a text value came first."""
    if is_number(value) and not isinstance(recorded, CategoricalDistribution):
        if isinstance(value, int):
            return IntDistribution(value, value)
        return FloatDistribution(float(value), float(value))
    if isinstance(recorded, CategoricalDistribution):
        options = list(recorded.choices)
    return CategoricalDistribution(options if value in options else [*options, value])


def point_distributions(point: dict[str, Any], spec: SweepSpec,
                        recorded: dict[str, BaseDistribution]) -> dict[str, BaseDistribution]:
    """:func:`fixed_distribution` of every value of ``point``."""
    choices = spec.choices()
    return {k: fixed_distribution(v, list(choices.get(k, [])), recorded.get(k))
            for k, v in point.items()}


def suggest_fixed(trial: optuna.Trial, key: str, value: Any, options: list[Any],
                  recorded: BaseDistribution | None) -> Any:
    """Record a queued grid value with :func:`fixed_distribution`."""
    dist = fixed_distribution(value, options, recorded)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, value, value)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(key, value, value)
    return trial.suggest_categorical(key, list(dist.choices))


def recorded_distributions(study: optuna.Study) -> dict[str, BaseDistribution]:
    """Each param's distribution in the study's earliest trial that has it."""
    out: dict[str, BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for key, dist in t.distributions.items():
            out.setdefault(key, dist)
    return out


def point_params(trial: optuna.Trial, spec: SweepSpec, storage: RDBStorage) -> dict[str, Any]:
    """The trial's grid point, recorded as Optuna params (kept as-is for a retried trial)."""
    frozen = storage.get_trial(trial._trial_id)
    params = dict(frozen.params)
    fixed = frozen.system_attrs.get("fixed_params") or {}
    choices = spec.choices()
    recorded = recorded_distributions(trial.study) if fixed else {}
    for key in fixed or choices:
        if key in params:
            continue
        if key in fixed:
            params[key] = suggest_fixed(trial, key, fixed[key], list(choices.get(key, [])),
                                        recorded.get(key))
        else:
            params[key] = trial.suggest_categorical(key, choices[key])
    return params


def point_problem(params: dict[str, Any], spec: SweepSpec) -> str | None:
    """Why the queued point ``params`` is not one of the spec's, or None. Every key must be a
    grid key of the spec and every value that is not a number one of the spec's values for it
    (numbers may differ: ``--widen`` adds lrs, a grown grid adds seeds). A point from a
    restored archive can therefore never pass ``main.py`` an option, a config file or a class
    path the spec does not name."""
    choices = spec.choices()
    for key, value in params.items():
        if key not in choices:
            return f"its grid point sets {key}, which is not a grid key of {spec.path}"
        if not is_number(value) and value not in choices[key]:
            return f"its grid point's {key}={value!r:.80} is not a value {spec.path} lists"
    return None
