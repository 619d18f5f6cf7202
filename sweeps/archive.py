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
Saving merges: studies the archive holds and the storage does not are kept. Restoring adds the
archive's studies the storage lacks, each trial under its own number, and leaves studies the
storage already has as they are. An archive may come from someone else: restore checks every
line first (:mod:`sweeps.archive_check`) and restores nothing if one is malformed.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from arbench.curves import significant
from arbench.files import atomic_write
from sweeps.archive_check import check_archive
from sweeps.report.loss import loss_curve
from sweeps.retry import without_rungs
from sweeps.storage import StorageError
from sweeps.trials import UNFINISHED, is_lock_study


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


def save(storage: Any, path: Path) -> dict[str, int]:
    """Write every study of ``storage`` to the archive at ``path``, keeping the archive's
    other studies; returns ``{study: trials}`` of what was written from the storage."""
    path = Path(path)
    kept = read_archive(path) if path.is_file() else {}
    names = [n for n in optuna.get_all_study_names(storage) if not is_lock_study(n)]
    for name in names:
        kept[name] = study_records(storage, name)

    def write(tmp: Path) -> None:
        with tmp.open("w") as f:
            for name in sorted(kept):
                for record in kept[name]:
                    f.write(json.dumps(record, sort_keys=True) + "\n")

    atomic_write(path, write)
    return {name: len(kept[name]) - 1 for name in names}


def restore(path: Path, storage: Any) -> tuple[dict[str, int], list[str]]:
    """Add the archive's studies that ``storage`` lacks; returns ``({study: trials added},
    [studies left as they were because the storage has them])``."""
    archive = read_archive(Path(path))
    check_archive(path, archive)  # all of it first: a bad line restores nothing
    present = set(optuna.get_all_study_names(storage))
    added: dict[str, int] = {}
    skipped = sorted(name for name in archive if name in present)
    for name in sorted(set(archive) - present):
        head, *trials = archive[name]
        study = optuna.create_study(
            study_name=name, storage=storage,
            directions=[StudyDirection[d.upper()] for d in head["directions"]])
        try:
            for key, value in head.get("user_attrs", {}).items():
                study.set_user_attr(key, value)
            for record in sorted(trials, key=lambda r: r.get("number", -1)):
                study.add_trial(frozen_trial(record))
        except Exception as err:
            optuna.delete_study(study_name=name, storage=storage)  # never half a study
            if isinstance(err, (KeyError, ValueError, TypeError)):
                raise StorageError(f"{path}: study {name} has a trial line this code cannot "
                                   f"read ({type(err).__name__}: {err}); nothing of it was "
                                   "restored") from None
            raise
        added[name] = len(trials)
    return added, skipped
