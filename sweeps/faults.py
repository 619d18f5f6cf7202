"""Telling a storage that stopped answering apart from a trial's failure, in one line.

A storage that stops answering mid-sweep: a database restart, a dropped connection, or
SQLite's "database is locked" after ``--lock-timeout`` seconds.

Such a fault is no trial's failure: the trial that was running is not recorded as failed (its
heartbeat stops, so a later run fails it as stale and resumes it from its ``last.ckpt``), and
the process stops with one line (:func:`storage_lost_message`) and status
:data:`STORAGE_LOST_STATUS`. Finished trials are in the database already; rerunning the same
command once the database answers again runs what is left.
"""

from __future__ import annotations

from sqlalchemy import exc

STORAGE_LOST_STATUS = 3
"""Exit status of a command whose storage went away."""


def storage_fault(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain (``__cause__``/``__context__``) that says the database is
    unreachable or locked (SQLAlchemy's ``OperationalError``, ``InterfaceError``,
    ``DisconnectionError``, or a driver error that invalidated its connection), or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (exc.OperationalError, exc.InterfaceError,
                                exc.DisconnectionError)):
            return current
        if isinstance(current, exc.DBAPIError) and current.connection_invalidated:
            return current
        current = current.__cause__ or current.__context__
    return None


def is_locked(fault: BaseException) -> bool:
    """SQLite's "database is locked" (another process held the write lock too long)."""
    return "database is locked" in str(fault)


def fault_reason(fault: BaseException) -> str:
    """The driver's first line, without SQLAlchemy's ``(driver.Error)`` prefix and
    background link."""
    orig = getattr(fault, "orig", None)
    text = str(orig if orig is not None else fault).strip()
    first = text.splitlines()[0] if text else type(fault).__name__
    return first.strip()


def storage_lost_message(fault: BaseException, worker: str | None = None) -> str:
    """One line for a fault: what happened, and what the user does next."""
    who = f"worker {worker}: " if worker else ""
    if is_locked(fault):
        what = ("the SQLite database stayed locked by another process for longer than "
                "--lock-timeout")
    else:
        what = "the storage went away"
    return (f"{who}{what} ({fault_reason(fault)}); finished trials are kept: rerun the same "
            "command once the database answers (an interrupted trial resumes from its "
            "last.ckpt)")


__all__ = ["STORAGE_LOST_STATUS", "fault_reason", "is_locked", "storage_fault",
           "storage_lost_message"]
