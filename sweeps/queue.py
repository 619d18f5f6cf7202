"""Queueing trials in the storage: the queue lock, grid points (or reused runs), retries.

Every grid point is queued as an Optuna WAITING trial under a short-lived lock study
(:func:`queue_lock`), so concurrent starts never queue a point twice; workers then claim
them (:mod:`sweeps.worker`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from sweeps.grow import extend_categorical_params
from sweeps.params import point_distributions, recorded_distributions
from sweeps.retry import without_rungs
from sweeps.reuse import reuse_trial, same_experiments
from sweeps.spec import SETTING, SpecError, SweepSpec, setting_name
from sweeps.trials import failed_points, grid_point, lock_study_name


@contextmanager
def queue_lock(storage: RDBStorage, study_name: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the study's queueing lock: the study ``_arbench_lock::<study>``, created (study
    names are unique in the storage, so one process wins) and deleted again on exit. It never
    stays beside the user's studies; one left by a killed holder is taken over after
    ``timeout`` seconds."""
    name = lock_study_name(study_name)
    deadline = time.time() + timeout
    while True:
        try:
            optuna.create_study(study_name=name, storage=storage)
            break
        except optuna.exceptions.DuplicatedStudyError:
            if time.time() > deadline:
                break  # its holder died while queueing
            time.sleep(0.2)
    try:
        yield
    finally:
        try:
            optuna.delete_study(study_name=name, storage=storage)
        except KeyError:
            pass


def requeue(study: optuna.Study, failed: optuna.trial.FrozenTrial) -> None:
    """Queue a fresh WAITING trial of the failed trial's point, as the storage does for a
    stale trial (same params and ``fixed_params``, ``failed_trial`` naming the old one, no rung
    values: ``sweeps.retry``)."""
    user_attrs = {k: v for k, v in failed.user_attrs.items() if k != "fail_reason"}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=failed.params, distributions=failed.distributions,
        user_attrs=user_attrs, system_attrs={**without_rungs(failed.system_attrs),
                                             "failed_trial": failed.number}))


def reuse_points(study: optuna.Study, spec: SweepSpec, points: list[dict[str, Any]],
                 storage: RDBStorage) -> dict[int, Any]:
    """Record the ``points`` a finished run of a ``reuse:`` study stands for
    (:mod:`sweeps.reuse`) as complete (or pruned) trials; returns them by index."""
    if not spec.reuse or not points:
        return {}
    found = same_experiments(spec, points, storage)
    recorded = recorded_distributions(study)
    for i, source in found.items():
        point = points[i]
        study.add_trial(reuse_trial(point, source, point_distributions(point, spec, recorded)))
    if found:
        names = sorted({f"{s.study}#{s.trial.number}" for s in found.values()})
        print(f"reused {len(found)} finished run(s): {', '.join(names)}", flush=True)
    return found


def enqueue(study: optuna.Study, spec: SweepSpec, storage: RDBStorage,
            points: list[dict[str, Any]]) -> int:
    """Queue ``points``, each recorded from a finished run of a ``reuse:`` study where one
    stands for it (:func:`reuse_points`) and queued as a WAITING trial otherwise; returns how
    many were queued. The caller holds :func:`queue_lock`."""
    reused = reuse_points(study, spec, points, storage)
    for i, point in enumerate(points):
        if i not in reused:
            study.enqueue_trial(point, skip_if_exists=False)
    return len(points) - len(reused)


def check_settings_kept(spec: SweepSpec, existing: list[dict[str, Any]]) -> None:
    """A study keeps the settings it began with (``settings:``, compared by name, in any
    order): a spec that gained or dropped ``settings:``, or changed which settings it lists,
    after its study began would queue runs whose task scores (a mean over the settings) no
    longer mean the same beside its runs, so it stops with one line (name a new study
    instead)."""
    if not existing:
        return
    had = {SETTING in point for point in existing}
    if had != {bool(spec.settings)}:
        now = "lists settings:" if spec.settings else "lists no settings:"
        before = "without" if spec.settings else "with"
        raise SpecError(f"{spec.path} {now}, but study {spec.study} has runs {before} a "
                        "setting; give the spec a new study name")
    ran = {setting_name(p[SETTING]) for p in existing if SETTING in p}
    listed = {setting_name(path) for path in spec.settings}
    if spec.settings and ran != listed:
        raise SpecError(f"{spec.path} lists settings {sorted(listed)}, but study {spec.study} "
                        f"began with {sorted(ran)}; give the spec a new study name")


def enqueue_grid(study: optuna.Study, spec: SweepSpec, storage: RDBStorage,
                 retry_failed: bool = False) -> tuple[int, int]:
    """Queue every grid point that has no trial yet and, with ``retry_failed``, every failed
    point again; returns ``(queued, requeued)``. A spec that gained a config (or another
    categorical value) since the study began has it added to the recorded choices first
    (:mod:`sweeps.grow`)."""
    with queue_lock(storage, spec.study):
        existing = [grid_point(t) for t in study.get_trials(deepcopy=False)]
        check_settings_kept(spec, existing)
        extend_categorical_params(storage, spec.study, spec.choices())
        queued = enqueue(study, spec, storage,
                         [point for point in spec.points() if point not in existing])
        failed = failed_points(study.get_trials(deepcopy=False)) if retry_failed else []
        for trial in failed:
            requeue(study, trial)
    return queued, len(failed)
