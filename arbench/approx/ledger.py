"""Fitted records kept on disk as they finish, so an interrupted study resumes where it stopped.

``<out>/records.jsonl``: the first line names the settings that decide a fit's outcome (the
study configuration, less ``ranks``, ``methods``, the degrees ``ps`` and the log interval, and
the source of the queries and keys, less its layers and heads where a layer's queries and keys
do not depend on which others were taken: a teacher's or a saved extraction's); each further
line is one fitted :class:`Record`, keyed by (layer, head, p, method). A rerun with the same
settings reuses every record already there and fits only the rest; fits are seeded, so the
tables match an uninterrupted run. Runs that differ only in ``--ranks``, ``--methods``, ``--p``
or (teacher, saved extraction) ``--layers``/``--heads`` share records: a rank or a degree can be
added to a finished study without refitting the others, and processes given disjoint layers or
degrees can fill one folder side by side: every append and every repair holds an exclusive
lock (``fcntl.flock`` on ``.records.jsonl.lock`` beside it), checks the settings line (written
once, by whichever comes first) against its own, and first cuts off a line a killed process left
unfinished, so no record is ever glued to another's remains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from arbench.approx.records import Record, StudyConfig

LEDGER_NAME = "records.jsonl"
Key = tuple[int, int, int, str]  # (layer, head, p, method)


SELECTION = ("layers", "heads")
"""The source's keys that say which layers and heads were taken."""

FIT_VERSION = 1
"""The fitting code's version: raise it with any change to the code that changes what a fit
gives for the same settings (a start, ALS, the polish, a split). It enters the settings line
from version 2 on (version 1's files were written without it), so a records file of fits made
by earlier code is refused rather than read into a table beside new floors and fits."""

ADDED_LATER = (", val_seqs=0",)
"""Settings added after record files were written, as they appear in the study's repr at their
defaults: left out of the settings line there, so those files stay resumable until one is set."""


def settings(config: StudyConfig, source: dict[str, Any]) -> dict[str, Any]:
    """What a record depends on, as plain JSON values (see the module docstring)."""
    fit = dataclasses.replace(config.fit, log_every=0)
    study = dataclasses.replace(config, ranks=(), methods=(), ps=(), fit=fit)
    meta = dict(source.get("meta") or {})
    if source.get("qk") or meta.get("source") == "teacher":  # synthetic ones are drawn together
        source = {k: v for k, v in source.items() if k not in SELECTION}
        source["meta"] = {k: v for k, v in meta.items() if k not in SELECTION}
    text = repr(study)
    for default in ADDED_LATER:
        text = text.replace(default, "")
    out = {"study": text, "source": source}
    if FIT_VERSION > 1:
        out["fit_version"] = FIT_VERSION
    return json.loads(json.dumps(out, default=str))


def key(record: Record) -> Key:
    """Where ``record`` sits in the study."""
    return record.layer, record.head, record.p, record.method


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<name>.lock`` beside ``path`` (released on exit, and
    by the kernel if the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cut_unfinished(path: Path) -> bool:
    """Truncate ``path`` after its last newline (a line a killed writer left unfinished);
    True when something was cut. Call under :func:`locked`."""
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return False
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return False
        data_end = size - 1
        step = 1 << 16
        while data_end > 0:  # find the last newline, reading backwards
            start = max(0, data_end - step)
            fh.seek(start)
            chunk = fh.read(data_end - start)
            at = chunk.rfind(b"\n")
            if at >= 0:
                fh.truncate(start + at + 1)
                return True
            data_end = start
        fh.truncate(0)
        return True


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written (it may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Ledger:
    """Append-only record file for one output folder and one set of settings."""

    def __init__(self, out: str | Path, config: StudyConfig, source: dict[str, Any],
                 repair: bool = True) -> None:
        """Read the file at ``out`` if there is one; with ``repair`` (a run about to append), a
        last line cut short by a kill is dropped from the file, else only skipped (a reader
        while another process may be appending)."""
        self.path = Path(out) / LEDGER_NAME
        self.settings = settings(config, source)
        self.done: dict[Key, Record] = {}
        if self.path.exists():
            if repair:
                with locked(self.path):
                    cut_unfinished(self.path)
                    self._load()
            else:
                self._load()

    def _check_head(self, first: str | None) -> None:
        """Raise unless ``first`` (the file's first line) is this ledger's settings line."""
        try:
            head = json.loads(first) if first else None
        except json.JSONDecodeError:
            head = None
        if head != {"settings": self.settings}:
            theirs = (head or {}).get("settings") if isinstance(head, dict) else None
            older = isinstance(theirs, dict) and \
                theirs.get("fit_version", 1) != self.settings.get("fit_version", 1)
            why = (f"fits of another version of the fitting code (fit version "
                   f"{theirs.get('fit_version', 1)}, this code's {FIT_VERSION})") if older else \
                "fits made with other settings (or is not a records file)"
            raise ValueError(f"{self.path} holds {why}; give another --out, or delete it to "
                             "start over")

    def _load(self) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        self._check_head(lines[0] if lines else None)
        fields = {f.name for f in dataclasses.fields(Record)}
        for number, line in enumerate(lines[1:], start=2):
            try:
                row = json.loads(line)
                record = Record(**{k: v for k, v in row.items() if k in fields})
            except (json.JSONDecodeError, TypeError):
                if number == len(lines) and not text.endswith("\n"):
                    break  # being written, or cut short by a kill (a repair or append cuts it)
                raise ValueError(f"{self.path}:{number}: not a record; delete the file to start "
                                 "over") from None
            self.done[key(record)] = record

    def get(self, k: Key) -> Record | None:
        """The stored record at ``k``, if any."""
        return self.done.get(k)

    def add(self, record: Record) -> None:
        """Store ``record`` as one appended line, under :func:`locked` (another process may
        append to the same file): the settings line first when the file is new, else a check
        that the file's settings are still this ledger's (raises ``ValueError`` if not, e.g. the
        file was deleted and begun again with other settings), and a line a killed writer left
        unfinished cut off first."""
        line = (json.dumps(dataclasses.asdict(record)) + "\n").encode()
        with locked(self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                with os.fdopen(os.dup(fd), "rb") as fh:
                    first = fh.readline()
                if first.endswith(b"\n"):
                    self._check_head(first.decode(errors="replace").rstrip("\n"))
                    cut_unfinished(self.path)
                else:  # new, or its settings line cut short by a kill
                    os.ftruncate(fd, 0)
                    write_all(fd, (json.dumps({"settings": self.settings}) + "\n").encode())
                write_all(fd, line)
            finally:
                os.close(fd)
        self.done[key(record)] = record
