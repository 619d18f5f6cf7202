"""The storage URL as a secret: where it comes from, how it is shown, how workers get it.

A PostgreSQL URL holds a password. It may be given three ways besides ``--storage URL`` (which
every user of the machine sees in the process list): the environment variable
``ARBENCH_STORAGE``, or ``--storage-file PATH`` (the URL on the file's first line). Worker
processes receive it in ``ARBENCH_STORAGE`` and never in their arguments
(:func:`argv_without_storage`). Everything printed or recorded shows :func:`masked` URLs and
:func:`scrub`-bed messages, the password replaced by ``***`` as SQLAlchemy renders it with
``hide_password=True``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from arbench.checks import CliError

ENV_VAR = "ARBENCH_STORAGE"
"""The environment variable that holds the storage URL (for the user, and for workers)."""
_USERINFO = re.compile(r"(?P<head>://[^:/@\s]*:)(?P<password>[^@\s]*)(?P<tail>@)")


def masked(url: str) -> str:
    """``url`` with its password shown as ``***`` (``postgresql://alice:***@host/db``); URLs
    without one are returned unchanged. A URL SQLAlchemy cannot parse is masked by pattern."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return _USERINFO.sub(r"\g<head>***\g<tail>", url)
    if parsed.password is None:
        return url
    return parsed.render_as_string(hide_password=True)


def password(url: str | None) -> str | None:
    """The password in ``url`` (as written, and decoded), or None."""
    if not url:
        return None
    match = _USERINFO.search(url)
    return match.group("password") or None if match else None


def scrub(text: str, url: str | None) -> str:
    """``text`` with ``url`` masked and any remaining copy of its password replaced by
    ``***`` (a driver's error message may quote it)."""
    if not url:
        return text
    text = text.replace(url, masked(url))
    secret = password(url)
    if secret:
        for form in {secret, unquote(secret)}:
            if len(form) >= 3:  # a one- or two-letter password would mask ordinary words
                text = text.replace(form, "***")
    return text


def read_storage_file(path: str) -> str:
    """The URL on the first non-empty line of ``path``; a missing, unreadable or empty file
    raises :class:`CliError` naming ``--storage-file`` (never its content)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise CliError(f"--storage-file {path}: cannot read it ({reason})") from None
    url = next((line.strip() for line in lines if line.strip()), "")
    if not url:
        raise CliError(f"--storage-file {path} is empty: write the storage URL on its first "
                       "line")
    return url


def given_storage(storage: str | None, storage_file: str | None) -> str | None:
    """The storage URL the user gave, by precedence: ``--storage``, ``--storage-file``, then
    ``$ARBENCH_STORAGE``; None when none is given (a spec's ``storage:`` or the default
    SQLite file applies then)."""
    if storage and storage_file:
        raise CliError("give --storage or --storage-file, not both")
    if storage:
        return storage
    if storage_file:
        return read_storage_file(storage_file)
    return os.environ.get(ENV_VAR) or None


def _is_storage_option(token: str) -> bool:
    """``--storage``, ``--storage-file``, or an abbreviation argparse accepts of the latter."""
    name = token.split("=", 1)[0]
    return name == "--storage" or (name.startswith("--storage-")
                                   and "--storage-file".startswith(name))


def argv_without_storage(argv: list[str]) -> list[str]:
    """``argv`` less every ``--storage``/``--storage-file`` option and its value (both the
    ``--storage URL`` and ``--storage=URL`` forms): a worker's command line."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if _is_storage_option(token):
            skip = "=" not in token
            continue
        out.append(token)
    return out


def worker_env(env: dict[str, str], url: str | None) -> dict[str, str]:
    """``env`` with ``ARBENCH_STORAGE`` set to ``url`` (the resolved storage of the worker's
    spec), or removed when the worker uses the default."""
    out = {k: v for k, v in env.items() if k != ENV_VAR}
    if url:
        out[ENV_VAR] = url
    return out


__all__ = ["ENV_VAR", "argv_without_storage", "given_storage", "masked",
           "password", "read_storage_file", "scrub", "worker_env"]
