"""The storage URL as a secret: where it comes from, how it is shown, how workers get it.

A PostgreSQL URL holds a password. It may be given three ways besides ``--storage URL`` (which
every user of the machine sees in the process list): the environment variable
``ARBENCH_STORAGE``, or ``--storage-file PATH`` (the URL on the file's first line). Worker
processes receive it in ``ARBENCH_STORAGE`` and never in their arguments
(:func:`argv_without_storage`). Everything printed or recorded shows :func:`masked` URLs and
:func:`scrub`-bed messages, each password replaced by ``***``: the ``user:password@`` part's
(everything up to the last ``@`` before the host, so a raw ``@`` in it stays hidden) and each
``password=`` query parameter's; a URL SQLAlchemy cannot parse is not shown at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, unquote_plus

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from arbench.checks import CliError

ENV_VAR = "ARBENCH_STORAGE"
"""The environment variable that holds the storage URL (for the user, and for workers)."""
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_QUERY_PASSWORD = re.compile(r"(?i)(?:^|[?&\s])(?:ssl)?password=(?P<value>'[^']*'?|[^&\s]*)")
UNPARSED = "<storage URL>"
"""What :func:`masked` shows for a URL SQLAlchemy cannot parse (its password cannot be found
for sure, so none of it shows)."""


def _userinfo_password(url: str) -> tuple[int, int] | None:
    """Where the password of ``url``'s ``user:password@`` lies: from the user's ``:`` to the
    last ``@`` before the host (a raw ``@`` may be part of the password), with or without a
    scheme and its slashes; None without one (or for a path-only URL like ``sqlite:///``)."""
    start = 0
    scheme = _SCHEME.match(url)
    if scheme:
        slashes = len(url[scheme.end():]) - len(url[scheme.end():].lstrip("/"))
        if slashes >= 3:  # sqlite:///path: no host, so no user or password
            return None
        if slashes:
            start = scheme.end() + slashes
    first_at = url.find("@", start)
    if first_at < 0:
        return None
    query = url.find("?", first_at)
    at = url.rfind("@", start, query if query >= 0 else len(url))
    user_end = url.find(":", start, at)
    if user_end < 0 or "/" in url[start:user_end] or user_end + 1 == at:
        return None
    return user_end + 1, at


def _password_spans(url: str) -> list[tuple[int, int]]:
    """Where each password in ``url`` lies: the userinfo's, and each ``password=`` (or
    ``sslpassword=``) value of its query or libpq ``key=value`` text; in order, not overlapping."""
    spans = []
    userinfo = _userinfo_password(url)
    if userinfo:
        spans.append(userinfo)
    for match in _QUERY_PASSWORD.finditer(url):
        begin, end = match.span("value")
        if end > begin and not (userinfo and begin < userinfo[1] and end > userinfo[0]):
            spans.append((begin, end))
    return sorted(spans)


def masked(url: str) -> str:
    """``url`` with each password shown as ``***`` (``postgresql://alice:***@host/db``,
    ``...?password=***``); URLs without one are returned unchanged, and a URL SQLAlchemy cannot
    parse is not shown at all (:data:`UNPARSED`)."""
    try:
        make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return UNPARSED
    out, last = [], 0
    for begin, end in _password_spans(url):
        out += [url[last:begin], "***"]
        last = end
    return "".join(out) + url[last:]


def passwords(url: str | None) -> list[str]:
    """The passwords in ``url`` as written (quotes of a libpq ``'value'`` removed)."""
    if not url:
        return []
    return [url[begin:end].strip("'") for begin, end in _password_spans(url)
            if url[begin:end].strip("'")]


def password(url: str | None) -> str | None:
    """The first password in ``url`` (:func:`passwords`), or None."""
    found = passwords(url)
    return found[0] if found else None


def scrub(text: str, url: str | None) -> str:
    """``text`` with ``url`` masked and any remaining copy of its passwords (as written, and
    decoded) replaced by ``***`` (a driver's error message may quote them)."""
    if not url:
        return text
    text = text.replace(url, masked(url))
    for form in sorted(_secret_forms(url), key=len, reverse=True):
        if len(form) >= 3:  # a one- or two-letter password would mask ordinary words
            text = text.replace(form, "***")
    return text


def _secret_forms(url: str) -> set[str]:
    """Every text of ``url``'s passwords a message may quote: as written, decoded, and the
    pieces either side of a raw ``@`` in one (SQLAlchemy reads ``alice:p@ss@host`` as password
    ``p`` on host ``ss@host``, and the driver then names that host)."""
    forms: set[str] = set()
    for secret in passwords(url):
        for whole in {secret, unquote(secret), unquote_plus(secret)}:
            pieces = whole.split("@")
            forms.add(whole)
            forms.update("@".join(pieces[i:]) for i in range(1, len(pieces)))
            forms.update("@".join(pieces[:i]) for i in range(1, len(pieces)))
    return forms


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


__all__ = ["ENV_VAR", "UNPARSED", "argv_without_storage", "given_storage", "masked",
           "password", "passwords", "read_storage_file", "scrub", "worker_env"]
