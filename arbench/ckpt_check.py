"""``--ckpt_path`` against the configuration, before anything is built or written.

Lightning would merge a checkpoint's saved hyperparameters into the parsed config, so a
checkpoint of another model silently replaced the method config and explicit flags (or failed
later with a ``size mismatch``). Here every saved model hyperparameter must equal the
configuration's; the error names each key that differs. Keys that only choose how the same
model is computed (``compile``, ``chunk_size``, ``attention_mode``) may differ; so may the
training-only keys (``lr``, ``seed``, ...) when validating or testing.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from arbench.checks import CliError

FREE_KEYS = {"compile", "chunk_size", "attention_mode"}
TRAINING_KEYS = {"lr", "weight_decay", "warmup_steps", "min_lr_ratio", "seed",
                 "feature_map_weight_decay", "init_from", "init_spare_std"}
_MISSING = object()


def last_checkpoint(folder: Path) -> Path | None:
    """The newest ``last*.ckpt`` in ``folder`` (what ``--ckpt_path last`` resumes), or None."""
    found = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime) \
        if folder.is_dir() else []
    return found[-1] if found else None


_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def load_tensors(path: str | Path, what: str, error: type[Exception] = CliError,
                 kind: str = "checkpoint") -> Any:
    """``torch.load`` of ``path`` with ``weights_only=True``: tensors, numbers, strings and
    containers of them, on the CPU. A file whose unpickling would build any other object
    (and so could run code) is refused before anything of it runs; it, and a file torch cannot
    read, raise ``error`` with one line that starts with ``what`` (e.g. ``--ckpt_path X``);
    ``kind`` names what the file should be."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = _UNSAFE_GLOBAL.search(str(err))
        if unsafe:
            raise error(f"{what} refused: it holds an object other than tensors and plain "
                        f"values ({unsafe.group(1)}), which loading could use to run code; "
                        "only files written by arbench's own torch.save are loaded") from None
        raise error(_unreadable(what, kind, err)) from None
    except Exception as err:  # torch raises many kinds for a truncated or foreign file
        raise error(_unreadable(what, kind, err)) from None


def _unreadable(what: str, kind: str, err: Exception) -> str:
    """One line for a file torch cannot read; the weights-only unpickler's own reason when it
    gives one (its message starts with a long preamble)."""
    text = str(err).strip()
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    lines = text.split(". ")[0].splitlines()
    reason = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return f"{what} is not a readable {kind} (truncated, or not written by torch.save: {reason})"


def read_checkpoint(path: str, option: str, error: type[Exception] = CliError,
                    missing: str = "{option} {path}: no such file") -> dict[str, Any]:
    """The Lightning checkpoint at ``path`` (tensors only, on the CPU: :func:`load_tensors`),
    given as ``option``; raises ``error`` with one line for a missing file (``missing``,
    formatted with ``option`` and ``path``), one that would run code when unpickled, one
    torch cannot read, or one without a ``state_dict``."""
    if not Path(path).is_file():
        raise error(missing.format(option=option, path=path))
    ckpt = load_tensors(path, f"{option} {path}", error)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise error(f"{option} {path} is not a Lightning checkpoint (no state_dict)")
    return ckpt


def saved_hparams(path: str) -> dict[str, Any]:
    """The model hyperparameters saved in the checkpoint at ``path``; one-line errors for a
    missing or unreadable file."""
    ckpt = read_checkpoint(path, "--ckpt_path")
    hparams = dict(ckpt.get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    return hparams


def differences(saved: Any, config: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, saved, config)`` for every leaf where the two differ; a differing
    ``class_path`` is reported alone, not its ``init_args``."""
    if isinstance(saved, dict) and isinstance(config, dict):
        if saved.get("class_path") != config.get("class_path"):
            return [(f"{key}.class_path", saved.get("class_path"), config.get("class_path"))]
        out = []
        for name in saved:
            sub = f"{key}.{name}" if key else name
            out += differences(saved[name], config.get(name, _MISSING), sub)
        return out
    if isinstance(saved, tuple):
        saved = list(saved)
    if isinstance(config, tuple):
        config = list(config)
    return [] if saved == config else [(key, saved, config)]


def _show(value: Any) -> str:
    if value is _MISSING or value is None:
        return "none"
    return value.get("class_path", str(value)) if isinstance(value, dict) else str(value)


def check_checkpoint(path: str, subcommand: str, model_config: dict[str, Any]) -> None:
    """Raise :class:`CliError` naming each model key where the checkpoint at ``path`` and the
    configuration disagree (training-only keys count only for ``fit``, i.e. a resume)."""
    saved = saved_hparams(path)
    ignored = FREE_KEYS | (set() if subcommand == "fit" else TRAINING_KEYS)
    diffs = [(k, a, b) for name in saved if name not in ignored
             for k, a, b in differences(saved[name], model_config.get(name, _MISSING), name)]
    if diffs:
        listed = "; ".join(f"model.{k}={_show(a)} (the config has {_show(b)})"
                           for k, a, b in diffs)
        raise CliError(f"checkpoint {path} was trained with {listed}: pass the --config files "
                       "and flags it was trained with")
