"""Command lines generated from a config dataclass.

Every field declared with :func:`opt` becomes an option: ``--name-with-dashes`` (or its
``flag``), typed from the field's annotation (a ``tuple[X, ...]`` takes one or more values, a
``bool`` is ``--x`` / ``--no-x``), its help ending with the default. Every option's parser
default is None, so :func:`given` returns only the options on the command line, checked against
their bounds; the caller applies them to a profile with ``dataclasses.replace``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any


def opt(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None,
        at_least: float | None = None, choices: tuple[str, ...] | None = None,
        nargs: str | None = None, if_empty: tuple[str, ...] | None = None,
        repeat: bool = False, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that is also an option. ``at_least``: lower bound of every value;
    ``nargs="*"`` with ``if_empty``: the value of the bare flag; ``repeat``: the flag may be
    given several times, one value each (a tuple of them)."""
    meta = {"help": help, "flag": flag, "at_least": at_least, "choices": choices,
            "nargs": nargs, "if_empty": if_empty, "repeat": repeat}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def _options(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """One option per :func:`opt` field of ``cls`` (dest: the field's name, default None)."""
    for f, hint in _options(cls):
        meta, default = f.metadata, _default(f)
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "choices": meta["choices"]}
        shown = default if not isinstance(default, tuple) else " ".join(map(str, default))
        kwargs["help"] = f"{meta['help']} (default: {shown})" if shown not in ("", ()) \
            else meta["help"]
        args = typing.get_args(hint)
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is tuple:
            kwargs["type"] = args[0]
            if meta["repeat"]:
                kwargs["action"] = "append"
            else:
                kwargs["nargs"] = meta["nargs"] or "+"
        else:
            kinds = [a for a in args if a is not type(None)] or [hint]
            kwargs["type"] = kinds[0]
        parser.add_argument(flag_of(f), **kwargs)


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """``{field: value}`` of the :func:`opt` options given in ``args`` (tuples for the
    tuple fields, ``if_empty`` for a bare ``nargs="*"`` flag); ``ValueError`` naming the flag
    for a value below its ``at_least``."""
    out = {}
    for f, hint in _options(cls):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if typing.get_origin(hint) is tuple:
            value = tuple(value) or f.metadata["if_empty"] or ()
        low = f.metadata["at_least"]
        for v in (value if isinstance(value, tuple) else (value,)):
            if low is not None and isinstance(v, (int, float)) and v < low:
                raise ValueError(f"{flag_of(f)} must be >= {low:g}, got {v:g}")
        out[f.name] = value
    return out


__all__ = ["add_options", "flag_of", "given", "opt"]
