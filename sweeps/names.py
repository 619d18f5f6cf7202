"""Names that become folder and file names (study, run folder, plot), and their checks.

Names that become folder and file names, and their checks: a study's (``runs/<study>/``,
``results/<study>/``), a trial's run folder (``runs/<study>/<point>/``, :func:`trial_name`)
and a plot's file.

Each must be one plain path component: not empty, not ``.`` or ``..``, without ``/``, ``\\``,
NUL or other control characters, at most :data:`MAX_NAME_BYTES` bytes, so that no spec or
archive can make arbench write outside ``runs/`` or ``results/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_NAME_BYTES = 200
"""Longest name in UTF-8 bytes (file systems allow 255; suffixes such as ``.png`` are added)."""


SHORT = {"seed_everything": "seed", "model.lr": "lr", "config": "cfg", "setting": "set-"}
"""Grid keys named in a run folder by another name than their last dotted part."""


def short_name(key: str) -> str:
    """A grid key as a run folder names it: ``model.lr`` -> ``lr``, ``a.b.p`` -> ``p``."""
    return SHORT.get(key, key.rsplit(".", 1)[-1])


def trial_name(params: dict[str, Any]) -> str:
    """A run folder's name from a grid point, e.g. ``p4_seed0_lr0.003``."""
    parts = []
    for key in sorted(params):
        value = params[key]
        if key == "config" and isinstance(value, (list, tuple)):
            value = "+".join(Path(str(v)).stem for v in value)
        elif key in ("config", "setting"):  # a config file, or a setting's overlay
            value = Path(str(value)).stem
        elif isinstance(value, (list, tuple)):  # e.g. mixers [conv, delta] -> conv-delta
            value = "-".join(str(v) for v in value)
        parts.append(f"{short_name(key)}{value}")
    return "_".join(parts).replace("/", "-").replace(":", "-")


def name_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a folder or file name, or None if it can."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty text"
    if value in (".", ".."):
        return "must not be . or .."
    if "/" in value or "\\" in value:
        return "must not contain / or \\"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "must not contain NUL or other control characters"
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"must be at most {MAX_NAME_BYTES} bytes long"
    return None


def check_name(value: Any, what: str, error: type[Exception]) -> str:
    """Return ``value``; raise ``error`` with one line naming ``what`` and the value
    (:func:`name_problem`) unless it is a safe folder name."""
    problem = name_problem(value)
    if problem is not None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 \
            else repr(value[:80] + "...")
        raise error(f"{what} {shown} {problem}: it becomes a folder or file name")
    return value


__all__ = ["MAX_NAME_BYTES", "check_name", "name_problem", "short_name", "trial_name"]
