"""The default profile: with no profile among the ``--config`` files, ``configs/profiles/cpu.yaml``.

A profile (``configs/profiles/``) sets the data and the training budget. A config file counts
as one when it sets the data (:data:`DATA_KEYS`) or one of the trainer's budget keys
:data:`BUDGET_KEYS`.
When no config file given to ``fit``, ``validate`` or ``test`` is a profile, the default
profile is read first, right after the subcommand, so every other config file and flag
overrides its keys. Any given profile replaces it entirely: none of the default's keys is read.
Flags (``--data.vocab_size``, ``--trainer.max_steps``) are not profiles: they override the
default's keys. Parsing without a subcommand (``build_cli(..., run=False)``, as the sweeps do)
is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from arbench.checks import CliError
from arbench.cli_errors import config_file_args, looks_like_config_file

DEFAULT_PROFILE = Path(__file__).resolve().parents[1] / "configs" / "profiles" / "cpu.yaml"
"""Read when no profile is given: the ``cpu`` profile, the same on every machine."""
BUDGET_KEYS = ("max_steps", "max_epochs", "max_time")
"""The ``trainer:`` keys that set a run's budget (with :data:`DATA_KEYS`, what makes a
profile)."""
DATA_KEYS = ("vocab_size", "train_segments", "test_segments", "batch_size")
"""The ``data:`` keys that make a config file a profile: the task's data and its batches."""


def config_mapping(value: str) -> dict[str, Any]:
    """The mapping a ``--config`` value holds: a YAML file or inline YAML; ``{}`` for anything
    else (the parser reports it)."""
    try:
        text = Path(value).read_text() if looks_like_config_file(value) else value
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def is_profile(config: dict[str, Any]) -> bool:
    """Whether a config mapping sets the data (:data:`DATA_KEYS`) or the trainer's budget. A
    recipe overlay's data switches (``data.shuffle``) do not make it a profile."""
    trainer, data = config.get("trainer"), config.get("data")
    return (isinstance(data, dict) and any(key in data for key in DATA_KEYS)) or (
        isinstance(trainer, dict) and any(key in trainer for key in BUDGET_KEYS))


def with_default_profile(argv: list[str], subcommands: Iterable[str]) -> tuple[list[str], bool]:
    """``argv`` with ``--config DEFAULT_PROFILE`` after the subcommand when none of its config
    files is a profile, and whether it was added. Config files before the subcommand hold the
    subcommand's keys under its name. ``argv`` without a subcommand is returned unchanged."""
    at = next((i for i, arg in enumerate(argv) if arg in set(subcommands)), None)
    if at is None:
        return argv, False
    before = [config_mapping(v).get(argv[at]) for v in config_file_args(argv[:at])]
    after = [config_mapping(v) for v in config_file_args(argv[at + 1:])]
    if any(isinstance(c, dict) and is_profile(c) for c in before + after):
        return argv, False
    if not DEFAULT_PROFILE.is_file():
        raise CliError(f"no profile given and the default profile {DEFAULT_PROFILE} is missing: "
                       "pass one with --config configs/profiles/<name>.yaml")
    return [*argv[:at + 1], "--config", str(DEFAULT_PROFILE), *argv[at + 1:]], True


def default_profile_note() -> str:
    """The line that says the default profile was used (printed on stderr)."""
    try:
        shown = DEFAULT_PROFILE.relative_to(Path.cwd())
    except ValueError:
        shown = DEFAULT_PROFILE
    return (f"note: no profile given: using the default profile, {shown} (data and budget); "
            "pick another with --config configs/profiles/<name>.yaml")


__all__ = ["BUDGET_KEYS", "DATA_KEYS", "DEFAULT_PROFILE", "config_mapping", "default_profile_note",
           "is_profile", "with_default_profile"]
