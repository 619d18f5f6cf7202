"""An archive line checked before anything of the archive is restored (``sweeps restore``).

An archive may come from someone else. Every line must have the shape ``sweeps save`` writes:
study names that are plain folder names (:mod:`sweeps.names`), known states and directions,
numbers that are numbers and fit the database (trial numbers and steps below 2**31, no
integer beyond 64 bits anywhere), text where text belongs, grid points whose run folders are
plain names, attributes the sweeps read of the type they read them as (:data:`TRIAL_USER_ATTRS`,
:data:`TRIAL_SYSTEM_ATTRS`, :data:`STUDY_USER_ATTRS`: a run's ``wall_time_s`` a number, a
retry's ``retry_history`` a list of trial numbers), and keys PostgreSQL stores (at most
:data:`MAX_KEY` characters, no NUL). The first line that is not so raises ``StorageError``
naming the file, the line and the field; :func:`sweeps.archive.restore` checks the whole
archive first, so a bad line anywhere restores nothing.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

from optuna.distributions import CategoricalDistribution, json_to_distribution

from sweeps.names import check_name, name_problem, trial_name
from sweeps.retry import RUNG_PREFIX
from sweeps.storage import StorageError
from sweeps.trials import is_lock_study, is_number

STATES = ("COMPLETE", "PRUNED", "FAIL", "WAITING")
DIRECTIONS = ("maximize", "minimize")
MAX_DB_INT = 2**31 - 1
"""Trial numbers and steps are 32-bit integer columns."""
MAX_INT = 2**63 - 1
MAX_KEY = 512
"""Attribute and parameter names are ``VARCHAR(512)`` columns in Optuna's schema."""
STUDY_KEYS = {"study", "directions", "user_attrs"}
TRIAL_KEYS = {"study", "number", "state", "values", "params", "distributions", "user_attrs",
              "system_attrs", "intermediate_values", "datetime_start", "datetime_complete"}


class BadLine(ValueError):
    """One field of one line is wrong; the message names the field."""


def _check_ints(value: Any, field: str) -> None:
    """No integer anywhere in ``value`` beyond 64 bits (the database could not hold it)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise BadLine(f"{field} holds an integer too large to store ({str(value)[:20]}...)")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_ints(v, f"{field}.{k}")
    elif isinstance(value, list):
        for v in value:
            _check_ints(v, field)


def _mapping(record: dict[str, Any], key: str) -> dict[str, Any]:
    """``record[key]`` (default empty), a mapping whose keys the database can store."""
    value = record.get(key, {})
    if not isinstance(value, dict):
        raise BadLine(f"{key} must be a mapping, got {type(value).__name__}")
    for name in value:
        if len(name) > MAX_KEY:
            raise BadLine(f"{key} has a key of {len(name)} characters ({name[:20]!r}...), "
                          f"longer than the database's {MAX_KEY}")
        if "\0" in name:
            raise BadLine(f"{key} has a key with a NUL character ({name!r:.40}), which "
                          "PostgreSQL cannot store")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _is_curve(value: Any) -> bool:
    """A list of ``[step, number]`` pairs, the step an integer."""
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and is_number(p[1])
        for p in value)


def _is_scores(value: Any) -> bool:
    """A mapping of names to numbers (a run's per-slice accuracy)."""
    return isinstance(value, dict) and all(map(is_number, value.values()))


AttrType = tuple[Callable[[Any], bool], str]
"""A check of an attr's value, and what it must be (for the message)."""
TEXT = (_or_null(lambda v: isinstance(v, str)), "text or null")
NUMBER_OR_NULL = (_or_null(is_number), "a number or null")
INT_OR_NULL = (_or_null(_is_int), "an integer or null")
CURVE = (_or_null(_is_curve), "a list of [step, number] pairs or null")
SCORES = (_or_null(_is_scores), "a mapping of numbers or null")
TRIAL_USER_ATTRS: dict[str, AttrType] = {
    "wall_time_s": (is_number, "a number"),
    "global_step": INT_OR_NULL, "collapsed_at": INT_OR_NULL,
    **dict.fromkeys(("val_acc", "last_val_acc", "example_acc", "last_example_acc"),
                    NUMBER_OR_NULL),
    **dict.fromkeys(("val_curve", "example_curve", "loss_curve"), CURVE),
    "slices": SCORES, "example_slices": SCORES,
    "hparams": (_or_null(lambda v: isinstance(v, dict)), "a mapping or null"),
    "converged": (_or_null(lambda v: isinstance(v, bool)), "true, false or null"),
    **dict.fromkeys(("run_name", "fail_reason", "reused_from", "log_dir", "config", "device",
                     "best_checkpoint", "last_checkpoint", "loss_curve_from"), TEXT),
}
"""The types of the trial user attrs the sweeps and their reports read (``sweeps/worker.py``
records them)."""
TRIAL_SYSTEM_ATTRS: dict[str, AttrType] = {
    "retry_history": (lambda v: isinstance(v, list) and all(map(_is_int, v)),
                      "a list of trial numbers"),
    "failed_trial": (_is_int, "a trial number"),
}
"""The trial system attrs a retry reads (Optuna's stale retry, :mod:`sweeps.retry`); each
``completed_rung_<k>``, the value the pruner compares at rung k, must be a number."""
STUDY_USER_ATTRS: dict[str, AttrType] = dict.fromkeys(("profile", "size", "metric", "spec"), TEXT)
"""The study user attrs :mod:`sweeps.study` records and reads."""


def _check_attrs(attrs: dict[str, Any], types: dict[str, AttrType], field: str) -> None:
    """Every attr of ``attrs`` that ``types`` names is of its type (others are not read)."""
    for key, value in attrs.items():
        if key in types and not types[key][0](value):
            raise BadLine(f"{field}.{key} must be {types[key][1]}, got {value!r:.40}")


def _count(value: Any, field: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DB_INT):
        raise BadLine(f"{field} must be an integer from 0 to {MAX_DB_INT}, got {value!r:.40}")
    return value


def _time(value: Any, field: str) -> None:
    if value is None:
        return
    try:
        datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise BadLine(f"{field} must be an ISO date and time or null, got {value!r:.40}") \
            from None


def _fits(dist: Any, value: Any) -> bool:
    """``dist`` (an archived distribution) is one Optuna reads and ``value`` is in it: a
    number within its bounds, or one of its categorical choices."""
    try:
        distribution = json_to_distribution(json.dumps(dist))
    except Exception:  # optuna raises several kinds for a malformed distribution
        return False
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    return is_number(value) and distribution.low <= value <= distribution.high


def check_study_line(record: dict[str, Any]) -> None:
    """A study line: known keys, ``directions`` a non-empty list of maximize/minimize."""
    unknown = sorted(set(record) - STUDY_KEYS)
    if unknown:
        raise BadLine(f"unknown key(s) {', '.join(unknown)}")
    directions = record.get("directions")
    if not (isinstance(directions, list) and directions
            and all(d in DIRECTIONS for d in directions)):
        raise BadLine(f"directions must be a list of {' or '.join(DIRECTIONS)}")
    user_attrs = _mapping(record, "user_attrs")
    _check_ints(user_attrs, "user_attrs")
    _check_attrs(user_attrs, STUDY_USER_ATTRS, "user_attrs")


def check_trial_line(record: dict[str, Any], n_objectives: int) -> None:
    """A trial line: a known state, a number, values that are numbers (as many as the study's
    directions when complete), params with their distributions, a curve of (step, number)
    pairs, ISO times, attrs of the types the sweeps read, and a grid point whose run folder is
    a plain name."""
    unknown = sorted(set(record) - TRIAL_KEYS)
    if unknown:
        raise BadLine(f"unknown key(s) {', '.join(unknown)}")
    _count(record.get("number"), "number")
    state = record.get("state")
    if state not in STATES:
        raise BadLine(f"state must be one of {', '.join(STATES)}, got {state!r:.40}")
    values = record.get("values")
    if values is not None and not (isinstance(values, list) and all(map(is_number, values))):
        raise BadLine("values must be a list of numbers or null")
    if state == "COMPLETE" and (values is None or len(values) != n_objectives):
        raise BadLine(f"a complete trial needs {n_objectives} value(s)")
    params, dists = _mapping(record, "params"), _mapping(record, "distributions")
    if set(params) != set(dists):
        raise BadLine("params and distributions must have the same keys")
    for key, dist in dists.items():
        if not _fits(dist, params[key]):
            raise BadLine(f"distributions.{key} is not an Optuna distribution of its "
                          f"param's value {params[key]!r:.40}")
    user_attrs, system_attrs = _mapping(record, "user_attrs"), _mapping(record, "system_attrs")
    for name, value in (("params", params), ("user_attrs", user_attrs),
                        ("system_attrs", system_attrs)):
        _check_ints(value, name)
    _check_attrs(user_attrs, TRIAL_USER_ATTRS, "user_attrs")
    _check_attrs(system_attrs, TRIAL_SYSTEM_ATTRS, "system_attrs")
    _check_attrs(system_attrs, {k: (is_number, "a number") for k in system_attrs
                                if k.startswith(RUNG_PREFIX)}, "system_attrs")
    curve = record.get("intermediate_values", [])
    if not (isinstance(curve, list) and all(
            isinstance(p, list) and len(p) == 2 and is_number(p[1]) for p in curve)):
        raise BadLine("intermediate_values must be a list of [step, number] pairs")
    for step, _ in curve:
        _count(step, "intermediate_values step")
    for key in ("datetime_start", "datetime_complete"):
        _time(record.get(key), key)
    point = system_attrs.get("fixed_params", params)
    if not isinstance(point, dict):
        raise BadLine("system_attrs.fixed_params must be a mapping")
    name = trial_name(point)
    if point and name_problem(name) is not None:
        raise BadLine(f"its grid point's run folder {name!r:.80} {name_problem(name)}")


def check_archive(path: Any, archive: dict[str, list[dict[str, Any]]]) -> None:
    """Check every study and trial line of a read archive; raise ``StorageError`` naming the
    first bad one (see the module's docstring)."""
    for study, records in archive.items():
        check_name(study, f"{path}: study", StorageError)
        if is_lock_study(study):
            raise StorageError(f"{path}: study {study} is a queueing lock, not a study (locks "
                               "are never saved); nothing was restored")
        head, *trials = records
        try:
            check_study_line(head)
        except BadLine as err:
            raise StorageError(f"{path}: study {study}'s line: {err}; nothing was restored") \
                from None
        numbers: set[int] = set()
        for record in trials:
            try:
                check_trial_line(record, len(head["directions"]))
            except BadLine as err:
                raise StorageError(f"{path}: study {study}, trial {record.get('number')!r:.20}"
                                   f": {err}; nothing was restored") from None
            if record["number"] in numbers:
                raise StorageError(f"{path}: study {study} has trial {record['number']} twice;"
                                   " nothing was restored")
            numbers.add(record["number"])


__all__ = ["MAX_KEY", "STUDY_USER_ATTRS", "TRIAL_SYSTEM_ATTRS", "TRIAL_USER_ATTRS", "BadLine",
           "check_archive", "check_study_line", "check_trial_line"]
