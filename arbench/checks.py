"""Checks that run before any work, so bad input fails in one line and nothing is written."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value``; raise ``ValueError`` naming ``name`` unless it is an integer >=
    ``minimum`` (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class CliError(ValueError):
    """Bad input found before any work; the message is printed after ``error:``."""


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` parser whose usage errors are one line on stderr, exit status 2: the
    message and a pointer to ``--help`` instead of the usage dump. Subcommand parsers made by
    ``add_subparsers`` are of the same class."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (run `{self.prog} --help` for the options)\n")
        sys.exit(2)


class NotWritableError(CliError):
    """An output folder cannot be created or written; the message names the option and path."""


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable_problem(path: str | Path) -> str | None:
    """Why a folder at ``path`` could not be created or written, or None; creates nothing."""
    target = Path(path)
    existing = _nearest_existing(target)
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def check_writable(path: str | Path, option: str) -> None:
    """Raise :class:`NotWritableError` if the folder ``path`` (given as ``option``) cannot be
    written; nothing is created."""
    problem = writable_problem(path)
    if problem is not None:
        raise NotWritableError(f"{option} {path}: cannot write there ({problem})")
