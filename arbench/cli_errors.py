"""One-line messages for the CLI's input errors: config files and jsonargparse's parser errors.

jsonargparse reports a bad value of a Union-typed key (``model.feature_map``) as a nested list
of every subtype's failure; :func:`short_parser_message` keeps the key and the one reason that
matters. Config files are checked before parsing, so an empty file or invalid YAML is named.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from arbench.checks import CliError

_CONFIG_FLAGS = ("--config", "-c")
_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "dict": "a mapping"}
_EXPECTED = re.compile(r"Expected a (?:<class '(\w+)'>|typing\.Literal\[(.*)\])$")
_NOT_FINITE = {"nan", "inf", "+inf", "-inf", "infinity", "-infinity"}
_SKIP_BULLETS = ("Expected a <class 'NoneType'>", "Expected a path but",
                 "Does not validate against any of the Union subtypes")


def config_file_args(argv: list[str]) -> list[str]:
    """The values of ``--config``/``-c`` in ``argv`` (``--config X``, ``--config=X``, ``-c X``
    and ``-c=X``, as argparse reads them)."""
    values = []
    for i, arg in enumerate(argv):
        if arg in _CONFIG_FLAGS and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(("--config=", "-c=")):
            values.append(arg.split("=", 1)[1])
    return values


def looks_like_config_file(value: str) -> bool:
    """Whether a ``--config`` value names a file (else it is inline YAML)."""
    return Path(value).suffix.lower() in (".yaml", ".yml", ".json") or Path(value).exists()


def check_config_file(path: str) -> None:
    """Raise :class:`CliError` naming ``path`` if it is missing, empty, not YAML or not a
    mapping."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise CliError(f"config file {path} is not valid YAML: {_yaml_reason(err)}") from None
    if data is None:
        raise CliError(f"config file {path} is empty (or holds only comments)")
    if not isinstance(data, dict):
        raise CliError(f"config file {path} must be a mapping of keys such as `model:`, got a "
                       f"{type(data).__name__}")


def _yaml_reason(err: yaml.YAMLError) -> str:
    """``problem at line L, column C`` from a PyYAML error."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def check_config_files(argv: list[str]) -> None:
    """Check every config file named in ``argv`` (inline YAML strings are left to the parser)."""
    for value in config_file_args(argv):
        if looks_like_config_file(value):
            check_config_file(value)


def _first_reason(lines: list[str]) -> str:
    """The first bullet of a Union error that is not about ``None`` or a path."""
    for i, line in enumerate(lines):
        if line.startswith("- ") and not line[2:].startswith(_SKIP_BULLETS):
            more = lines[i + 1] if line.endswith(":") and i + 1 < len(lines) else ""
            return f"{line[2:]} {more}".strip()
    return lines[0] if lines else ""


def _expected_union(key: str, lines: list[str]) -> str | None:
    """``key: expected A or B, got V`` when every Union subtype failed only on its type."""
    kinds: list[str] = []
    literals: list[str] = []
    for line in lines:
        if not line.startswith("- ") or line[2:].startswith(_SKIP_BULLETS):
            continue
        match = _EXPECTED.match(line[2:])
        if match is None:
            return None
        if match.group(1):
            kinds.append(_TYPE_NAMES.get(match.group(1), match.group(1)))
        else:
            literals += [v.strip().strip("'") for v in match.group(2).split(",")]
    if literals:
        kinds.append("one of " + ", ".join(dict.fromkeys(literals)))
    if not kinds:
        return None
    given = next((line[len("Given value: "):] for line in lines
                  if line.startswith("Given value: ")), None)
    return f"{key}: expected {' or '.join(kinds)}" + (f", got {given}" if given else "")


def _phrase(key: str, reason: str) -> str:
    """``key: reason`` with jsonargparse's phrases turned into plain words."""
    class_path = re.search(r"class_path='([^']+)'", reason)
    reason = re.sub(r"^Type .*? expects a function or a callable class: ", "", reason)
    reason = re.sub(r"\. Got value: Namespace\(.*$", "", reason)
    inner = re.match(r'Parser key "([^"]+)":\s*(.*)', reason)
    if inner:
        key, reason = f"{key}.init_args.{inner.group(1)}", inner.group(2)
    expected = re.match(r"Expected a <class '(\w+)'>\. Got value: (.*)", reason)
    if expected:
        kind, got = expected.groups()
        if kind == "float" and got.strip().lower() in _NOT_FINITE:
            return f"{key} must be a finite number, got {got}"
        return f"{key}: expected {_TYPE_NAMES.get(kind, kind)}, got {got}"
    if class_path and ("No module named" in reason or "has no attribute" in reason):
        return f"{key}: cannot import class_path {class_path.group(1)} ({reason})"
    option = re.match(r"Option '([^']+)' is not accepted", reason)
    if option:
        owner = f" of {class_path.group(1)}" if class_path else ""
        return f"{key}.init_args.{option.group(1)}: no such option{owner}"
    return f"{key}: {reason}"


def short_parser_message(message: str) -> str:
    """One line from a jsonargparse error message, naming the key where there is one."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid arguments"
    head = re.match(r'Parser key "([^"]+)":\s*(.*)', lines[0])
    if head is None:
        return lines[0] + (f" {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else "")
    key, rest = head.groups()
    if not rest:
        union = _expected_union(key, lines[1:])
        if union:
            return union
    return _phrase(key, rest or _first_reason(lines[1:]))
