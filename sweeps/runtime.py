"""How long a queued run is expected to take, and the deadline of ``sweeps run --until``.

A queued or running trial is timed by the median wall time of the finished runs (completed or
pruned) nearest to it: those sharing the most of its grid values other than lr and seed. The
study's own runs are preferred; a reused run (timed on another machine or load) counts only
where it shares more values than any own run. ``python -m sweeps status`` sums these over the
queue.

A worker given a deadline asks for a bound rather than an expectation
(``conservative=True``): completed runs only (a pruned run stopped early, and the run it
stands for may not be), and for a point that shares no grid value with any of them (an LLoPS
p = 6 point where only p = 2 and 4 have run) the longest of them, since nothing says how its
cost compares. It starts only the queued runs whose bound ends before the deadline.
"""

from __future__ import annotations

import datetime
import re
import statistics
from dataclasses import dataclass

from optuna.trial import TrialState

from sweeps.spec import SpecError
from sweeps.trials import RESULTS, Trial, Trials, grid_point, point_values


@dataclass(frozen=True)
class TimedRun:
    """A finished run's grid values (lr and seed aside), wall time in seconds, whether the
    study trained it (not reused from another study) and whether it ran to its end (not
    pruned)."""

    point: dict[str, str]
    seconds: float
    own: bool
    complete: bool = True


def timed_runs(trials: Trials) -> list[TimedRun]:
    """The finished runs of ``trials`` that recorded their wall time."""
    return [TimedRun(point_values(grid_point(t)), float(t.user_attrs["wall_time_s"]),
                     not t.user_attrs.get("reused_from"), t.state == TrialState.COMPLETE)
            for t in trials if t.state in RESULTS and "wall_time_s" in t.user_attrs]


def expected_seconds(trial: Trial, timed: list[TimedRun],
                     conservative: bool = False) -> float | None:
    """The median wall time of the runs of ``timed`` nearest to ``trial``, in seconds, or
    with ``conservative`` the deadline's bound (see the module docstring); None when no run
    (no completed run, for the bound) has finished."""
    if conservative:
        timed = [run for run in timed if run.complete]
    if not timed:
        return None
    point = point_values(grid_point(trial))
    shared = [sum(point.get(k) == v for k, v in run.point.items()) for run in timed]
    nearest = max(shared)
    if conservative and point and nearest == 0:  # nothing alike has run: the longest run
        return max(run.seconds for run in timed)
    near = [run for run, n in zip(timed, shared) if n == nearest]
    if any(run.own for run in near):
        near = [run for run in near if run.own]
    return statistics.median(run.seconds for run in near)


_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_SPAN = re.compile(r"\+(?:(\d+)h)?(?:(\d+)m)?")


def parse_until(text: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """The deadline ``text`` names, in local time: ``HH:MM`` (its next occurrence: today, or
    tomorrow once today's has passed), ``+<H>h<M>m`` (from now; ``+90m``, ``+2h``, ``+1h30m``),
    or an ISO date and time (``2026-12-06T21:40``). Anything else is one line of
    :class:`SpecError`."""
    now = now or datetime.datetime.now()
    text = text.strip()
    clock, span = _CLOCK.fullmatch(text), _SPAN.fullmatch(text)
    if clock and int(clock[1]) < 24 and int(clock[2]) < 60:
        at = now.replace(hour=int(clock[1]), minute=int(clock[2]), second=0, microsecond=0)
        return at if at > now else at + datetime.timedelta(days=1)
    if span and (span[1] or span[2]):
        return now + datetime.timedelta(hours=int(span[1] or 0), minutes=int(span[2] or 0))
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise SpecError(f"--until {text!r} is not HH:MM, +<H>h<M>m (e.g. +90m) or an ISO date "
                        "and time (2026-12-06T21:40)") from None


__all__ = ["TimedRun", "expected_seconds", "parse_until", "timed_runs"]
