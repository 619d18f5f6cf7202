"""Optuna storage for sweeps: SQLite under ``runs/`` by default, any RDB URL otherwise.

Trials send heartbeats; a RUNNING trial whose heartbeat is older than ``grace`` seconds (its
process was killed, or the machine lost power) is marked FAIL and a copy with the same grid
point is queued again (Optuna's ``RetryHeartbeatStaleTrialCallback``, less the stale trial's rung
values: ``sweeps.retry``). Trials that fail by raising are not retried.

On SQLite every transaction starts with ``BEGIN IMMEDIATE`` (see ``serialize_sqlite``): the
driver would otherwise begin only at the first write, and two workers could both read a trial as
WAITING and both claim it.
"""

from __future__ import annotations

import time
from pathlib import Path

from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.engine import Engine

from sweeps.faults import is_locked, storage_fault, storage_lost_message
from sweeps.retry import RetryStaleWithoutRungs
from sweeps.secrets import masked, scrub

DEFAULT_DB = Path("runs") / "sweeps.db"


class StorageError(RuntimeError):
    """The storage URL cannot be opened."""


def default_url(create: bool = True) -> str:
    """``sqlite:///runs/sweeps.db``; ``create`` makes its folder."""
    if create:
        DEFAULT_DB.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{DEFAULT_DB}"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for other URLs and in-memory SQLite)."""
    prefix = "sqlite:///"
    return Path(url[len(prefix):]) if url.startswith(prefix) and len(url) > len(prefix) else None


def serialize_sqlite(engine: Engine) -> None:
    """Take SQLite's write lock when a transaction begins, so read-then-write is atomic.

    Optuna reads a row ``FOR UPDATE`` before changing it; SQLite ignores that clause, and
    pysqlite delays ``BEGIN`` to the first write, so the read ran outside any transaction.
    """
    @event.listens_for(engine, "connect")
    def _driver_does_not_begin(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners would keep the old behaviour


def schema_race(text: str, waited: float, lock_timeout: float) -> bool:
    """Whether an error opening the storage (its text, after ``waited`` seconds of trying) is
    two processes creating a new database's schema at once, which the loser retries.

    SQLite's "database is locked" counts only when it came well before ``lock_timeout`` (SQLite
    gives up at once on a deadlock between two writers); after the whole timeout another
    process holds the lock, and retrying would multiply ``--lock-timeout``."""
    if any(r in text for r in ("already exists", "UNIQUE constraint", "duplicate key")):
        return True
    return "locked" in text and waited < lock_timeout / 2


def open_storage(url: str | None, heartbeat: int = 30, grace: int = 120,
                 must_exist: bool = False, lock_timeout: float = 120.0) -> RDBStorage:
    """An ``RDBStorage`` with heartbeats; raises ``StorageError`` with one line if unreachable
    (the URL's password masked, :mod:`sweeps.secrets`).

    ``must_exist`` (for reading: report, status) refuses a SQLite file that does not exist
    instead of creating an empty database. ``lock_timeout``: seconds a SQLite statement waits
    for another process's write lock before it fails with "database is locked"."""
    url = url or default_url(create=not must_exist)
    path = sqlite_path(url)
    if must_exist and path is not None and not path.is_file():
        raise StorageError(f"no sweep database at {path}: nothing has run there yet "
                           "(start a sweep with `python -m sweeps run SPEC`)")
    engine_kwargs = {}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": lock_timeout}}
    elif url.startswith("postgresql"):
        engine_kwargs = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    started = time.monotonic()
    for attempt in range(6):
        try:
            storage = RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat,
                                 grace_period=grace, heartbeat_stale_trial_callback=(
                                     RetryStaleWithoutRungs(max_retry=3)))
        except Exception as err:  # sqlalchemy raises many kinds; reduce to one line
            text = str(err).strip()
            if schema_race(text, time.monotonic() - started, lock_timeout) and attempt < 5:
                time.sleep(0.5 * (attempt + 1))
                continue
            first = text.splitlines()[0] if text else type(err).__name__
            fault = storage_fault(err)
            if fault is not None and is_locked(fault):  # not the URL's fault: say what to do
                first = storage_lost_message(fault)
            # the whole line is scrubbed: the driver may quote the password, or the piece of it
            # SQLAlchemy misread as the host
            raise StorageError(scrub(f"cannot open storage {masked(url)}: {first}", url)) \
                from None
        if storage.engine.name == "sqlite":
            serialize_sqlite(storage.engine)
        return storage
    raise AssertionError("unreachable")

