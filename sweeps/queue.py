"""Queueing trials in the storage: the queue lock, grid points (or reused runs), retries.

Every grid point is queued as an Optuna WAITING trial under a short-lived lock study
(:func:`queue_lock`), so concurrent starts never queue a point twice; workers then claim
them (:mod:`sweeps.worker`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.storages._rdb.models import StudyDirectionModel, StudyModel, StudyUserAttributeModel
from optuna.study import StudyDirection
from optuna.trial import TrialState
from sqlalchemy import exc as sqlalchemy_exc
from sqlalchemy import orm
from sqlalchemy.orm import exc as orm_exc

from sweeps.grow import extend_categorical_params
from sweeps.params import point_distributions, recorded_distributions
from sweeps.retry import without_rungs
from sweeps.reuse import reuse_trial, same_experiments
from sweeps.spec import SETTING, SpecError, SweepSpec, setting_name
from sweeps.trials import failed_points, grid_point, is_number, lock_study_name

LOCK_POLL = 0.2
"""Seconds between looks at a queueing lock another start holds."""


def lock_stamp(token: str) -> dict[str, Any]:
    """The ``holder`` user attr a queueing lock is created with: this process (pid, host),
    the time it takes the lock (epoch seconds, now), and ``token``, which no other start's
    lock has."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
            "token": token}


def holder_text(stamp: dict[str, Any] | None) -> str:
    """Who holds a lock, for a line: ``pid P on HOST``."""
    if not stamp:
        return "a start that left no stamp"
    return f"pid {str(stamp.get('pid'))[:20]} on {str(stamp.get('host'))[:80]}"


def read_stamp(lock: StudyModel) -> dict[str, Any] | None:
    """A lock study's ``holder`` stamp; None where it has none (a lock left by a start from
    before stamps) or it cannot be read."""
    for attr in lock.user_attributes:
        if attr.key == "holder":
            try:
                stamp = json.loads(attr.value_json)
            except (TypeError, ValueError):
                return None
            since = stamp.get("since") if isinstance(stamp, dict) else None
            if is_number(since) and math.isfinite(since) and isinstance(stamp.get("token"),
                                                                        str):
                return stamp
    return None


@contextmanager
def one_transaction(storage: RDBStorage) -> Iterator[orm.Session]:
    """A session whose work commits as one transaction (on SQLite it begins with ``BEGIN
    IMMEDIATE``, :func:`sweeps.storage.serialize_sqlite`), rolled back on an error."""
    session = storage.scoped_session()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def find_lock(session: orm.Session, name: str) -> StudyModel | None:
    """The lock study ``name``, its row locked until the transaction ends."""
    return (session.query(StudyModel).filter(StudyModel.study_name == name)
            .with_for_update().one_or_none())


def try_lock(storage: RDBStorage, name: str, token: str,
             stale: Callable[[int, dict[str, Any] | None], bool]
             ) -> tuple[bool, bool, dict[str, Any] | None]:
    """One try at the lock study ``name``, in one transaction: create it with a stamp
    (:func:`lock_stamp`) where there is none, or where ``stale(study_id, its stamp)`` says
    the one there is past its timeout, delete that and create it again. Returns whether this
    start holds the lock now, whether it found one there, and that one's stamp (None: it has
    none). Of starts that try at once, one creates the lock (study names are unique); the
    others find it held."""
    try:
        with one_transaction(storage) as session:
            found = find_lock(session, name)
            other = read_stamp(found) if found is not None else None
            if found is not None:
                if not stale(found.study_id, other):
                    return False, True, other
                session.delete(found)
                session.flush()
            lock = StudyModel(study_name=name)
            session.add(lock)
            session.add(StudyDirectionModel(study=lock, objective=0,
                                            direction=StudyDirection.MINIMIZE))
            session.add(StudyUserAttributeModel(study=lock, key="holder",
                                                value_json=json.dumps(lock_stamp(token))))
        return True, found is not None, other
    except (sqlalchemy_exc.IntegrityError, orm_exc.StaleDataError):
        return False, False, None  # another start took it in between: look again


def release_lock(storage: RDBStorage, name: str, token: str) -> dict[str, Any] | None:
    """Delete the lock study ``name`` where it is the one this start holds (its stamp has
    ``token``). Returns None then, or where there is none; else the stamp of the lock there
    instead (empty where it has none)."""
    with one_transaction(storage) as session:
        found = find_lock(session, name)
        if found is None:
            return None
        stamp = read_stamp(found)
        if stamp is None or stamp.get("token") != token:
            return stamp or {}
        session.delete(found)
    return None


@contextmanager
def queue_lock(storage: RDBStorage, study_name: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the study's queueing lock: the study ``_arbench_lock::<study>``, created with the
    holder's stamp (:func:`lock_stamp`; study names are unique in the storage, so one start
    wins) and deleted again on exit, only while it is still this start's. It never stays
    beside the user's studies. A lock held longer than ``timeout`` seconds (its holder was
    killed, or lost its storage, while queueing) is taken over: deleted and created again in
    one transaction, so of two starts that find it so, one takes it. A lock with no stamp is
    timed from when this start first saw it."""
    name = lock_study_name(study_name)
    token = uuid.uuid4().hex
    first_seen: dict[tuple[int, str | None], float] = {}

    held = 0.0  # seconds the lock found last had been held

    def stale(study_id: int, other: dict[str, Any] | None) -> bool:
        """Whether the lock found has been held ``timeout`` s: by its stamp, or for as long as
        this start has seen it where that is longer (a stamp from a clock running ahead, or
        none)."""
        nonlocal held
        now = time.time()
        seen = first_seen.setdefault((study_id, other["token"] if other else None), now)
        held = now - seen if other is None else max(now - float(other["since"]), now - seen)
        return held >= timeout

    told: set[str | None] = set()
    while True:
        taken, found, other = try_lock(storage, name, token, stale)
        if taken:
            break
        holder = other["token"] if other else None
        if found and holder not in told:
            told.add(holder)
            print(f"waiting for the queueing lock of study {study_name}, held by "
                  f"{holder_text(other)}; taken over once held {timeout:.0f} s", flush=True)
        time.sleep(LOCK_POLL)
    if found:
        print(f"took over the queueing lock of study {study_name} from {holder_text(other)}, "
              f"held {held:.0f} s: its holder died or "
              "stalled while queueing", flush=True)
    try:
        yield
    finally:
        instead = release_lock(storage, name, token)
        if instead is not None:
            print(f"the queueing lock of study {study_name} was taken over by "
                  f"{holder_text(instead)} while this start queued (past the {timeout:.0f} s "
                  "timeout) and is left to it: a point both queued is queued twice",
                  flush=True)


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
