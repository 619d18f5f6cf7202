"""The spec's Optuna study: its sampler and pruner, created or opened in a storage."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import RDBStorage

from sweeps.spec import SpecError, SweepSpec, make_pruner


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    """The spec's sampler for asking new points (grid points are enqueued, not sampled)."""
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=0)
    return optuna.samplers.RandomSampler(seed=0)


def study_pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    """The spec's pruner; on a grid, deciding within each bracket (``sweeps.pruning``)."""
    pruner = make_pruner(spec.pruner, spec.pruner_args)
    if spec.sampler == "grid" and spec.pruner != "none":
        from sweeps.pruning import BracketPruner  # here: keeps Lightning out of CLI start-up

        return BracketPruner(pruner, grid_lrs=spec.lr or None)
    return pruner


def _sized(size: str | None) -> str:
    return f", size {size}" if size else ""


def ran_at(attrs: dict[str, Any], spec: SweepSpec) -> tuple[str, str | None]:
    """The ``(profile, size)`` a study's runs trained at, from its user attrs ``attrs``; the
    spec's own where the study recorded none (a size recorded as None: the model's default)."""
    return (attrs.get("profile", spec.profile), attrs["size"] if "size" in attrs else spec.size)


def check_same_profile(study: optuna.Study, spec: SweepSpec) -> None:
    """A study keeps the profile and size its runs trained at: a point is one grid value set,
    whatever the profile, so a run at another (``--profile smoke``) would take the place of the
    study's own run of that point. Stops with one line (another ``--storage`` or study name);
    a study recorded before sizes were kept has the spec's default size."""
    if not study.get_trials(deepcopy=False):
        return
    ran = ran_at(study.user_attrs, spec)
    if ran != (spec.profile, spec.size):
        raise SpecError(f"study {spec.study} ran at profile {ran[0]}{_sized(ran[1])}, this run "
                        f"asks for profile {spec.profile}{_sized(spec.size)}: give it another "
                        "--storage (e.g. a smoke run: sqlite:///runs/smoke.db), or the spec "
                        "another study name")


def make_study(spec: SweepSpec, storage: RDBStorage) -> optuna.Study:
    """Create (or open) the spec's study with its sampler and pruner; a study with runs at
    another profile or size stops (:func:`check_same_profile`)."""
    study = optuna.create_study(study_name=spec.study, storage=storage,
                                sampler=make_sampler(spec),
                                pruner=study_pruner(spec), direction=spec.direction,
                                load_if_exists=True)
    check_same_profile(study, spec)
    study.set_user_attr("spec", str(spec.path))
    study.set_user_attr("profile", spec.profile)
    study.set_user_attr("size", spec.size)
    study.set_user_attr("metric", spec.metric)  # what a study reusing its runs needs to know
    return study


def load_study(spec: SweepSpec, storage: RDBStorage) -> optuna.Study:
    """Open the spec's existing study with its sampler and pruner."""
    return optuna.load_study(study_name=spec.study, storage=storage, sampler=make_sampler(spec),
                             pruner=study_pruner(spec))
