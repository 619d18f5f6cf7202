"""A sweep storage as a text file in the repo: ``python -m sweeps save FILE`` and ``restore FILE``.

A sweep's Optuna database lives on the machine that runs it (``runs/sweeps.db``); a study that
takes more sessions than one machine lives must carry its finished runs in the repo. The
archive is JSON Lines, one line per study and one per trial (sorted by study, then trial
number), so a commit of a grown archive is a diff of added lines:

- ``{"study": name, "directions": [...], "user_attrs": {...}}``
- ``{"study": name, "number": n, "state": "COMPLETE", "values": [...], "params": {...},
  "distributions": {...}, "user_attrs": {...}, "system_attrs": {...},
  "intermediate_values": [[step, value], ...], "datetime_start": iso, "datetime_complete": iso}``

A finished trial recorded before runs kept their training loss in the record (``loss_curve``,
:mod:`sweeps.report.loss`) is archived with the one its TensorBoard event files hold, when they
are on the saving machine (``loss_curve_from: "event files"``): they stay behind with it.
A trial that was running or waiting when saved is archived as WAITING: its process and its
``last.ckpt`` stay behind with the machine, so a restored sweep queues it again from the start,
without the rung values the pruner had recorded for it (``sweeps.retry``): it is judged again
on its new run.
Saving merges: studies the archive holds and the storage does not are kept; a study both hold
is written as the storage has it, unless the archive holds finished runs of it that the
storage lacks (a machine that started the study anew instead of restoring it): ``save``
refuses, naming them, rather than drop them (``replace`` names the studies whose archived runs
may go). Restoring adds the archive's studies the storage lacks, each trial under its own
number, and leaves studies the storage already has as they are. An archive may come from
someone else: restore checks every line first (:mod:`sweeps.archive_check`) and restores
nothing if one is malformed.

A study is restored trial by trial, marked (:data:`RESTORING`) from before its first trial to
after its last: a restore cut off part-way (killed, or a storage fault that also stopped the
half study being deleted) leaves the mark, and the next restore deletes that study and restores
it again. Until then ``status`` and ``run`` refuse it (:func:`check_not_half_restored`), and so
does ``save``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.storages import BaseStorage, RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from arbench.curves import significant
from arbench.files import atomic_write
from sweeps.archive_check import check_archive
from sweeps.report.loss import loss_curve
from sweeps.retry import without_rungs
from sweeps.storage import StorageError
from sweeps.trials import UNFINISHED, is_lock_study, is_number

RESTORING = "_arbench_restoring"
"""A study system attr: the archive a restore is adding the study from, set before its first
trial and set to None after its last. A study whose value is not None was cut off part-way."""
FINISHED_STATES = ("COMPLETE", "PRUNED")
"""Archived trials ``save`` never drops unasked: runs that hold a result."""


def _time(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value else None


def _parse_time(value: str | None) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(value) if value else None


def trial_record(study: str, t: FrozenTrial) -> dict[str, Any]:
    """One trial as an archive line (RUNNING and WAITING become WAITING, with no times, curve
    or rung values; a failed trial has no values, :func:`archived_values`)."""
    waiting = t.state in UNFINISHED
    return {"study": study, "number": t.number,
            "state": "WAITING" if waiting else t.state.name,
            "values": archived_values(t.state, t.values), "params": t.params,
            "distributions": {k: json.loads(distribution_to_json(d))
                              for k, d in t.distributions.items()},
            "user_attrs": t.user_attrs if waiting else with_loss_curve(t.user_attrs),
            "system_attrs": without_rungs(t.system_attrs) if waiting else t.system_attrs,
            "intermediate_values": [] if waiting else sorted(t.intermediate_values.items()),
            "datetime_start": None if waiting else _time(t.datetime_start),
            "datetime_complete": None if waiting else _time(t.datetime_complete)}


def with_loss_curve(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` with a ``loss_curve`` read from the run's event files when the record lacks
    one and the files are here (marked ``loss_curve_from``); else ``attrs`` unchanged."""
    if attrs.get("loss_curve"):
        return attrs
    logged = loss_curve(attrs.get("log_dir"))
    if not logged:
        return attrs
    return {**attrs, "loss_curve": [[step, significant(value)] for step, value in logged],
            "loss_curve_from": "event files"}


def archived_values(state: TrialState, values: list[float] | None) -> list[float] | None:
    """A trial's objective values as kept: none for a trial that is unfinished or failed.
    Optuna refuses to add a failed trial with values, and a study's database can hold one (a
    pruned trial marked failed by hand keeps its last value), which would make the whole study
    unrestorable."""
    return None if state in (*UNFINISHED, TrialState.FAIL) else values


def frozen_trial(record: dict[str, Any]) -> FrozenTrial:
    """The archive line as a trial to add to a study."""
    state = TrialState[record["state"]]
    return FrozenTrial(
        number=record["number"], state=state, value=None,
        values=archived_values(state, record.get("values")),
        datetime_start=_parse_time(record.get("datetime_start")),
        datetime_complete=_parse_time(record.get("datetime_complete")),
        params=record["params"],
        distributions={k: json_to_distribution(json.dumps(d))
                       for k, d in record["distributions"].items()},
        user_attrs=record["user_attrs"], system_attrs=record["system_attrs"],
        intermediate_values={int(s): v for s, v in record["intermediate_values"]},
        trial_id=0)


def read_archive(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{study: [study line, trial lines...]}``; a file that is not an archive is one line
    of ``StorageError``."""
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise StorageError(f"cannot read archive {path}: {err.strerror or err}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            study = record["study"]
            if not isinstance(study, str):
                raise TypeError(study)
        except (ValueError, TypeError, KeyError, RecursionError):  # JSON, digits, nesting
            raise StorageError(f"{path}:{i} is not a sweep archive line "
                               "(write archives with `python -m sweeps save`)") from None
        out.setdefault(study, []).append(record)
    for study, records in out.items():
        if "directions" not in records[0]:
            raise StorageError(f"{path}: study {study} has trials but no study line first")
    return out


def study_records(storage: Any, name: str) -> list[dict[str, Any]]:
    """The archive lines of one study of ``storage``."""
    study = optuna.load_study(study_name=name, storage=storage)
    head = {"study": name, "directions": [d.name.lower() for d in study.directions],
            "user_attrs": study.user_attrs}
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    return [head, *(trial_record(name, t) for t in trials)]


def _storage(storage: Any) -> BaseStorage:
    """``storage``, a storage or a database URL, as a storage."""
    return storage if isinstance(storage, BaseStorage) else RDBStorage(storage)


def half_restored(storage: Any) -> dict[str, str]:
    """``{study: archive}`` of the studies of ``storage`` whose restore was cut off part-way
    (:data:`RESTORING`)."""
    return {study.study_name: str(study.system_attrs[RESTORING])
            for study in _storage(storage).get_all_studies()
            if study.system_attrs.get(RESTORING) is not None}


def check_not_half_restored(storage: Any, names: Iterable[str] | None = None) -> None:
    """Raise one line of ``StorageError`` if a study of ``names`` (default: every study of
    ``storage``) holds only part of the archive it was restored from."""
    half = half_restored(storage)
    blocked = sorted(half if names is None else set(names) & set(half))
    if blocked:
        name = blocked[0]
        raise StorageError(f"study {name} holds only part of its archive (its restore was cut "
                           f"off): rerun `python -m sweeps restore {half[name]}` with this "
                           "storage to restore it whole")


def _trial_key(record: dict[str, Any], whole: bool = True) -> tuple[str, str]:
    """What tells an archived trial apart from another study's that ran the same point: its
    params (numbers as floats, as the storage may give an int back as a float) and its start
    (``whole``: as recorded, microseconds included; else to the second); its number when it
    has no start."""
    params = record.get("params")
    if isinstance(params, dict):
        params = {k: float(v) if is_number(v) else v for k, v in params.items()}
    start = record.get("datetime_start")
    return (json.dumps(params, sort_keys=True, default=str),
            (str(start) if whole else str(start)[:19]) if start
            else f"#{record.get('number')}")


def _to_the_second(record: dict[str, Any]) -> bool:
    """Whether ``record``'s start has no fraction of a second (a database that drops them)."""
    start = record.get("datetime_start")
    return bool(start) and "." not in str(start)[19:]


def dropped_trials(archived: list[dict[str, Any]],
                   stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finished (complete or pruned) trial lines of ``archived`` (one study's archive
    lines) that ``stored`` (the storage's lines of it) does not hold: none with its params and
    its start to the microsecond, or to the second where either side's start has no fraction
    (a database may drop the microseconds). Two runs of one point started in the same second
    are told apart."""
    have = {_trial_key(r) for r in stored[1:]}
    coarse = {_trial_key(r, whole=False) for r in stored[1:] if _to_the_second(r)}
    every_second = {_trial_key(r, whole=False) for r in stored[1:]}

    def held(r: dict[str, Any]) -> bool:
        second = _trial_key(r, whole=False)
        return _trial_key(r) in have or second in coarse or (
            _to_the_second(r) and second in every_second)

    return [r for r in archived[1:] if r.get("state") in FINISHED_STATES and not held(r)]


def save(storage: Any, path: Path, replace: Iterable[str] = ()) -> dict[str, int]:
    """Write every study of ``storage`` to the archive at ``path``, keeping the archive's
    other studies; returns ``{study: trials}`` of what was written from the storage. Refuses
    (one line of ``StorageError``, nothing written) a half-restored study, and a study whose
    archived finished trials the storage lacks unless ``replace`` names it."""
    path = Path(path)
    kept = read_archive(path) if path.is_file() else {}
    names = [n for n in optuna.get_all_study_names(storage) if not is_lock_study(n)]
    check_not_half_restored(storage, names)
    replace = set(replace)
    for name in names:
        records = study_records(storage, name)
        lost = [] if name in replace else dropped_trials(kept.get(name, []), records)
        if lost:
            numbers = ", ".join(str(r.get("number")) for r in lost[:3]) + (
                ", ..." if len(lost) > 3 else "")
            raise StorageError(
                f"{path} holds {len(lost)} finished trial(s) of study {name} that this storage "
                f"lacks (number {numbers}; the storage has {len(records) - 1} trial(s)): "
                "saving would drop them, so nothing was saved; restore the archive into a "
                f"storage without {name} and go on there, or save with --replace {name} to "
                "drop them")
        kept[name] = records

    def write(tmp: Path) -> None:
        with tmp.open("w") as f:
            for name in sorted(kept):
                for record in kept[name]:
                    f.write(json.dumps(record, sort_keys=True) + "\n")

    atomic_write(path, write)
    return {name: len(kept[name]) - 1 for name in names}


def _cut_off(storage: BaseStorage, name: str, archived: list[dict[str, Any]]) -> str | None:
    """Why the storage's study ``name`` is an unfinished restore of ``archived`` (its archive
    lines) to delete and redo: it carries :data:`RESTORING`, or it is empty where the archive's
    is not (no trial, no attr: cut off between its creation and its mark); None for a study to
    keep."""
    study_id = storage.get_study_id_from_name(name)
    mark = storage.get_study_system_attrs(study_id).get(RESTORING)
    n = storage.get_n_trials(study_id)
    if mark is not None:
        return f"its restore from {mark} was cut off with {n} trial(s) in"
    if n == 0 and not storage.get_study_user_attrs(study_id) \
            and (len(archived) > 1 or archived[0].get("user_attrs")):
        return "the storage holds it empty (a restore cut off as it began)"
    return None


def restore(path: Path, storage: Any,
            say: Callable[[str], None] = print) -> tuple[dict[str, int], list[str]]:
    """Add the archive's studies that ``storage`` lacks, and again those a cut-off restore left
    in part (told by one line to ``say``); returns ``({study: trials added}, [studies left as
    they were because the storage has them])``."""
    archive = read_archive(Path(path))
    check_archive(path, archive)  # all of it first: a bad line restores nothing
    storage = _storage(storage)
    present = set(optuna.get_all_study_names(storage))
    for name in sorted(set(archive) & present):
        why = _cut_off(storage, name, archive[name])
        if why is not None:
            say(f"restoring {name} again: {why}")
            optuna.delete_study(study_name=name, storage=storage)
            present.discard(name)
    added: dict[str, int] = {}
    skipped = sorted(name for name in archive if name in present)
    for name in sorted(set(archive) - present):
        head, *trials = archive[name]
        study = optuna.create_study(
            study_name=name, storage=storage,
            directions=[StudyDirection[d.upper()] for d in head["directions"]])
        study_id = storage.get_study_id_from_name(name)
        storage.set_study_system_attr(study_id, RESTORING, str(path))
        try:
            for key, value in head.get("user_attrs", {}).items():
                study.set_user_attr(key, value)
            for record in sorted(trials, key=lambda r: r.get("number", -1)):
                study.add_trial(frozen_trial(record))
        except Exception as err:
            # never half a study; should deleting it fail too, its mark has the next restore
            # redo it
            optuna.delete_study(study_name=name, storage=storage)
            if isinstance(err, (KeyError, ValueError, TypeError)):
                raise StorageError(f"{path}: study {name} has a trial line this code cannot "
                                   f"read ({type(err).__name__}: {err}); nothing of it was "
                                   "restored") from None
            raise
        storage.set_study_system_attr(study_id, RESTORING, None)
        added[name] = len(trials)
    return added, skipped
