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
degrees can fill one folder side by side (each line is appended in one write; the settings line
is written once, by whichever comes first).
"""

from __future__ import annotations

import dataclasses
import json
import os
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
            self._load(repair)

    def _load(self, repair: bool = True) -> None:
        lines = self.path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
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
        fields = {f.name for f in dataclasses.fields(Record)}
        for number, line in enumerate(lines[1:], start=2):
            try:
                row = json.loads(line)
                record = Record(**{k: v for k, v in row.items() if k in fields})
            except (json.JSONDecodeError, TypeError):
                if number == len(lines):  # a line cut short by a kill: drop it, fit it again
                    if repair:
                        self.path.write_text("".join(f"{x}\n" for x in lines[:-1]))
                    break
                raise ValueError(f"{self.path}:{number}: not a record; delete the file to start "
                                 "over") from None
            self.done[key(record)] = record

    def get(self, k: Key) -> Record | None:
        """The stored record at ``k``, if any."""
        return self.done.get(k)

    def add(self, record: Record) -> None:
        """Store ``record``: one line, appended in one write (another process may append to
        the same file); the settings line first when the file is new."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():  # appears whole, settings line and all, or not at all
            fresh = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            fresh.write_text(json.dumps({"settings": self.settings}) + "\n")
            try:
                os.link(fresh, self.path)
            except FileExistsError:  # another process created it first
                pass
            finally:
                fresh.unlink()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (json.dumps(dataclasses.asdict(record)) + "\n").encode())
        finally:
            os.close(fd)
        self.done[key(record)] = record
