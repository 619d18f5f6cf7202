"""Sweep specs: YAML files naming base configs, a grid over any config key, and the objective.

A spec::

    study: p_ablation                  # Optuna study name (runs/<study>/ holds its runs)
    configs: [configs/p4.yaml]         # method config(s), as main.py takes them
    profile: cpu                       # configs/profiles/<profile>.yaml (``--profile`` overrides)
    size: tiny                         # configs/sizes/<size>.yaml (``--size`` overrides; none:
                                       # the model's default size)
    grid:                              # Cartesian product; any main.py key, or an alias
      p: [2, 4, 6]                     # = model.feature_map.init_args.p
      seed: [0, 1, 2]                  # = seed_everything
      "rank,m": [[1, 256], [2, 128]]   # = model.feature_map.init_args.rank, ...m
    lr: [1.0e-3, 3.0e-3]               # learning-rate sub-grid of every point (model.lr)
    objective: {metric: val/acc, direction: maximize}   # or val/example_acc (zoology's)
    sampler: grid                      # grid | tpe | random (then n_trials)
    pruner: none                       # none | median | halving | threshold, or a mapping
                                       # {type: median, n_startup_trials: 2} (Optuna kwargs)
    args: []                           # extra main.py arguments for every trial; a
                                       # --config FILE.yaml among them resolves as configs do
    profiles: {smoke: {lr: [3.0e-3]}}  # per-profile replacements of the keys above
    claims:                            # comparisons checked seed by seed in the report
      - {name: "p=4 > p=2", better: {p: 4}, worse: {p: 2}}   # rows selected by hparams
      - {name: "qk-norm helps", better: {variant: qk-norm}, worse: {variant: baseline}}
      # optional ``paper_gain: warmstart``: the paper's relative gain (sweeps.paper) beside it
    reuse: [p_ablation]                # finished runs of these studies stand for equal points
    settings: [configs/settings/a.yaml, configs/settings/b.yaml]   # a task's difficulty
                                       # settings: overlays on the profile, each point trained
                                       # once per setting (MAD's protocol)
    extends: bases/suite.yaml          # a base spec, relative to this file: its keys, each key
                                       # here replacing the base's; profiles merge per name
    description: text                  # what the study is; written under table.md's title
    plots:                             # accuracy against an hparam, one line per series
      - {x: p, series: feature_map, name: acc_vs_p}
      - {x: step, name: learning_curves}   # val/acc against step at each point's best lr
      - {x: step, y: train_loss, name: loss_curves}   # their training loss, smoothed
      - {x: state_size, series: mixers, marker_by: method}   # unjoined points, a shape per method
      - {x: state_size, y: L1024_N256, marker_by: method}  # y: one slice's accuracy

Grid aliases (:data:`ALIASES`): ``p``, ``m``, ``rank`` (the feature map's), ``d_model``, ``lr``
(``model.lr``), ``seed`` (``seed_everything``) and ``precision`` (``trainer.precision``, e.g.
``[32-true, bf16-mixed]``) stand for their full keys, which the study
records. A grid key ``config`` takes config file paths (a method per value), or lists of paths that
compose (a method and an overlay). Keys joined by commas vary together (zipped), for budgets
such as a fixed m·t; a ``null`` in a zipped row leaves that key to the point's config (BASED's
r beside LLoPS's m and t in one grid). A value ``best:<study>`` stands for the last checkpoint
of that finished study's run with the trial's seed at its best lr (``sweeps.refs``), e.g. for
``model.init_from``.

``settings:`` lists a task's difficulty settings as config overlays applied after the profile
and the spec's ``args:``, each one trained as a run of its own (MAD's protocol: a model per
setting, not one model on a mixture; ``sampler: grid`` only). Every grid point runs once per
setting; its runs carry the grid key ``setting`` (the overlay's path, named by its stem in run
folders and row labels), each setting picks its own best lr, and a point's *task score* (the
claims of its table and its plots against an hparam: the objective; the suite's cell: each
run's mean over its test slices) is the mean over the settings of each seed's value, for the
seeds that have every setting (:mod:`sweeps.report.settings`). A study keeps the settings it
began with: a spec that gains or drops ``settings:``, or lists other ones, needs a new study
name. ``best:<study>`` of a study with settings
picks the run at the trial's own setting.

``extends:`` (:func:`read_spec`) shares keys between specs: the base file's mapping, with each
top-level key of the extending file replacing the base's, except ``profiles:``, whose entries
merge per profile name (the extending file's ``profiles.smoke.args`` beside the base's
``profiles.smoke.grid``). One level only: a base does not extend another. A base is no study
(it has no ``study:``) and lives in ``sweeps/bases/``, out of the ``sweeps/*.yaml`` that are.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from sweeps.names import check_name, trial_name
from sweeps.paper import PAPER_GAINS

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"study", "configs", "profile", "size", "grid", "lr", "objective", "sampler",
           "n_trials", "pruner", "args", "profiles", "storage", "description", "plots",
           "claims", "reuse", "settings"}
SETTING = "setting"
"""The grid key a point's difficulty setting (``settings:``) runs under; no grid may name it."""
ALIASES = {"p": "model.feature_map.init_args.p", "m": "model.feature_map.init_args.m",
           "rank": "model.feature_map.init_args.rank", "d_model": "model.d_model",
           "lr": "model.lr", "seed": "seed_everything", "precision": "trainer.precision"}
"""Short grid keys and the main.py keys they stand for."""
SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "median", "halving", "threshold")


class SpecError(ValueError):
    """A sweep spec that cannot run; the message names the key."""


def make_pruner(name: str, args: dict[str, Any]) -> Any:
    """The Optuna pruner ``name`` (see ``PRUNERS``) with keyword ``args``.

    ``median`` defaults to ``n_warmup_steps=1`` (no verdict on the first validation);
    ``threshold`` prunes a trial whose reported value leaves ``[lower, upper]``. Values are
    reported at the trainer's global step after every validation.
    """
    kinds = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
             "halving": optuna.pruners.SuccessiveHalvingPruner,
             "threshold": optuna.pruners.ThresholdPruner}
    defaults = {"median": {"n_warmup_steps": 1}}.get(name, {})
    try:
        return kinds[name](**{**defaults, **args})
    except (TypeError, ValueError) as err:
        raise SpecError(f"pruner {name}: {err}") from None


def _check_pruner(value: Any) -> tuple[str, dict[str, Any]]:
    """``pruner: median`` or ``pruner: {type: median, ...kwargs}`` → (name, kwargs), checked."""
    args: dict[str, Any] = {}
    if isinstance(value, dict):
        args = {k: v for k, v in value.items() if k != "type"}
        value = value.get("type")
    name = str(value)
    if name not in PRUNERS:
        raise SpecError(f"pruner must be one of {PRUNERS} (or a mapping with type:), got {value!r}")
    if name == "none" and args:
        raise SpecError("pruner none takes no arguments")
    make_pruner(name, args)
    return name, args


@dataclass
class SweepSpec:
    """A validated spec with its profile applied."""

    path: Path
    study: str
    configs: list[str]
    profile: str
    grid: dict[str, list[Any]]
    lr: list[float]
    size: str | None = None
    metric: str = "val/acc"
    direction: str = "maximize"
    sampler: str = "grid"
    n_trials: int | None = None
    pruner: str = "none"
    pruner_args: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    storage: str | None = None
    plots: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    reuse: list[str] = field(default_factory=list)
    description: str = ""
    settings: list[str] = field(default_factory=list)
    """The task's difficulty settings: config overlays, each trained as its own run."""

    @property
    def profile_path(self) -> str:
        return str(ROOT / "configs" / "profiles" / f"{self.profile}.yaml")

    @property
    def size_path(self) -> str | None:
        return None if self.size is None else str(ROOT / "configs" / "sizes" / f"{self.size}.yaml")

    def points(self) -> list[dict[str, Any]]:
        """Every grid point (lr included) as ``{key: value}``, zipped keys split apart; a
        zipped ``null`` leaves its key out of the point (the config's value stands)."""
        axes: list[list[dict[str, Any]]] = []
        for key, values in self.grid.items():
            names = [k.strip() for k in key.split(",")]
            axes.append([{k: x for k, x in zip(names, v if len(names) > 1 else [v])
                          if x is not None or len(names) == 1} for v in values])
        if self.lr:
            axes.append([{"model.lr": lr} for lr in self.lr])
        if self.settings:  # last: a point's settings run one after another
            axes.append([{SETTING: path} for path in self.settings])
        return [dict(item for d in combo for item in d.items())
                for combo in itertools.product(*axes)]

    def choices(self) -> dict[str, list[Any]]:
        """Every parameter's possible values (for Optuna's categorical distributions)."""
        out: dict[str, list[Any]] = {}
        for point in self.points():
            for k, v in point.items():
                if v not in out.setdefault(k, []):
                    out[k].append(v)
        return out


def _resolve(path: str) -> str:
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = ROOT / p
    if not p.exists():
        raise SpecError(f"config file not found: {path}")
    return str(p)


def _resolve_config_value(value: Any) -> Any:
    """A grid's ``config`` value resolved: a path, or a list of paths that compose."""
    return [_resolve(x) for x in value] if isinstance(value, list) else _resolve(value)


def _resolve_configs(key: str, values: list[Any]) -> list[Any]:
    """Grid ``key``'s values with their ``config`` paths resolved (:func:`_resolve`), also where
    ``config`` is zipped with other keys (``"config,m"``); other keys' values as they are."""
    names = [k.strip() for k in key.split(",")]
    if "config" not in names:
        return values
    if len(names) == 1:
        return [_resolve_config_value(v) for v in values]
    at = names.index("config")
    return [[_resolve_config_value(x) if i == at else x for i, x in enumerate(row)]
            for row in values]


def _resolve_args(args: list[Any]) -> list[str]:
    """``args`` as strings, each ``--config FILE.yaml`` (or ``--config=FILE.yaml``) path resolved
    like ``configs:`` (relative to the repo when not found here), so a spec's overlay, e.g. a
    task's smoke profile, does not depend on the working directory."""
    out: list[str] = []
    for arg in map(str, args):
        if out and out[-1] == "--config" and arg.endswith((".yaml", ".yml")):
            arg = _resolve(arg)
        elif arg.startswith("--config=") and arg.endswith((".yaml", ".yml")):
            arg = "--config=" + _resolve(arg[len("--config="):])
        out.append(arg)
    return out


def setting_name(path: str) -> str:
    """A setting as run folders and row labels name it: its overlay's file stem."""
    return Path(str(path)).stem


def _check_settings(value: Any) -> list[str]:
    """``settings:`` as resolved overlay paths: YAML files with distinct stems (their names)."""
    if value is None:
        return []
    if not (isinstance(value, list) and all(isinstance(x, str) and x.endswith((".yaml", ".yml"))
                                            for x in value)):
        raise SpecError("settings must be a list of config overlay files (.yaml), one per "
                        f"difficulty setting, got {value!r:.80}")
    names = [setting_name(x) for x in value]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(f"settings names {twice[0]} twice: each setting is named by its file's "
                        "stem, so the stems must differ")
    return [_resolve(x) for x in value]


def _expand_aliases(key: str) -> str:
    """``"rank,m"`` → the full keys, comma-joined (:data:`ALIASES`)."""
    return ",".join(ALIASES.get(k.strip(), k.strip()) for k in key.split(","))


def _check_grid(grid: Any) -> dict[str, list[Any]]:
    if not isinstance(grid, dict) or not grid:
        raise SpecError("grid must be a non-empty mapping of config keys to lists of values")
    expanded = {_expand_aliases(str(key)): values for key, values in grid.items()}
    names = [k for key in grid for k in _expand_aliases(str(key)).split(",")]
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise SpecError(f"grid sets {twice[0]} twice (an alias and its full key?)")
    grid = expanded
    if SETTING in names:
        raise SpecError(f"grid names {SETTING!r}, the key settings: runs under; list a task's "
                        "difficulty settings under settings:")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"grid.{key} must be a non-empty list")
        width = len(key.split(","))
        if width > 1 and not all(isinstance(v, list) and len(v) == width for v in values):
            raise SpecError(f"grid.{key}: zipped keys need lists of {width} values each")
    return grid


PLOT_KEYS = {"x", "y", "series", "name", "xscale", "where", "title", "marker_by"}

TRAIN_LOSS = "train_loss"
"""The ``y`` of a ``x: step`` plot that draws training-loss curves instead of the objective
(:mod:`sweeps.report.loss`)."""


def _check_plots(value: Any) -> list[dict[str, Any]]:
    """Each plot: a mapping with ``x`` and only :data:`PLOT_KEYS`; ``where`` a mapping."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError("plots must be a list of mappings with an x: key")
    for i, plot in enumerate(value):
        if not isinstance(plot, dict) or "x" not in plot:
            raise SpecError(f"plots[{i}] must be a mapping with an x: key")
        unknown = sorted(set(plot) - PLOT_KEYS)
        if unknown:
            raise SpecError(f"plots[{i}]: unknown key(s) {', '.join(unknown)} "
                            f"(allowed: {', '.join(sorted(PLOT_KEYS))})")
        if plot["x"] == "step" and plot.get("y", TRAIN_LOSS) != TRAIN_LOSS:
            raise SpecError(f"plots[{i}]: a plot against step draws the objective (no y:) or "
                            f"the training loss (y: {TRAIN_LOSS}), not y: {plot['y']}")
        if plot.get("marker_by", "method") != "method":
            raise SpecError(f"plots[{i}].marker_by must be method (a marker shape per method)")
        if not isinstance(plot.get("where", {}), dict):
            raise SpecError(f"plots[{i}].where must map hparams (or a*b products) to values")
        if "name" in plot:  # results/<study>/<name>.png
            check_name(plot["name"], f"plots[{i}].name", SpecError)
    return list(value)


def _check_claims(value: Any) -> list[dict[str, Any]]:
    """Each claim: ``{name: str, better: {hparam: value}, worse: {hparam: value}}``, and
    optionally ``paper_gain:`` a name in ``sweeps.paper.PAPER_GAINS`` to print beside it and
    ``parity:`` a number of points (also check that the two sides' means differ by at most the
    ``worse`` side's seed std, or that many points when it is larger)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SpecError("claims must be a list of {name, better, worse} mappings")
    for i, claim in enumerate(value):
        if not (isinstance(claim, dict) and {"name", "better", "worse"} <= set(claim)
                <= {"name", "better", "worse", "paper_gain", "parity"}
                and isinstance(claim["better"], dict) and isinstance(claim["worse"], dict)):
            raise SpecError(f"claims[{i}] must be a mapping of name, better: {{hparam: value}} "
                            "and worse: {hparam: value} (and optionally paper_gain, parity)")
        parity = claim.get("parity", 0)
        if isinstance(parity, bool) or not isinstance(parity, (int, float)) or parity < 0:
            raise SpecError(f"claims[{i}].parity must be a number of points >= 0, got {parity!r}")
        if "paper_gain" in claim and claim["paper_gain"] not in PAPER_GAINS:
            raise SpecError(f"claims[{i}].paper_gain must be one of {sorted(PAPER_GAINS)}, "
                            f"got {claim['paper_gain']!r}")
    return list(value)


def _read_mapping(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path`` (an empty file: ``{}``); else :class:`SpecError`."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError(f"{path} is not valid YAML: {err}".splitlines()[0]) from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path} must hold a mapping")
    return raw


def _check_keys(raw: dict[str, Any], path: Path, allowed: set[str]) -> None:
    """Every top-level key of ``path``'s mapping ``raw`` is in ``allowed``."""
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SpecError(f"unknown key(s) in {path.name}: {', '.join(unknown)} "
                        f"(allowed: {', '.join(sorted(allowed))})")


def _profiles(raw: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """``raw``'s ``profiles:`` as ``{name: {key: value}}`` (an empty profile: ``{}``)."""
    profiles = raw.get("profiles") or {}
    if not (isinstance(profiles, dict)
            and all(v is None or isinstance(v, dict) for v in profiles.values())):
        raise SpecError(f"profiles in {path.name} must map profile names to mappings of keys")
    return {name: dict(keys or {}) for name, keys in profiles.items()}


def read_spec(path: Path) -> dict[str, Any]:
    """The spec at ``path`` as one mapping, its ``extends:`` base applied: the base's keys, each
    top-level key of ``path`` replacing the base's, and ``profiles:`` merged per profile name.

    The base's path is relative to ``path``'s folder. A base that extends another (a chain, or
    a cycle back to ``path``), a missing base, or one that is no mapping raises
    :class:`SpecError` in one line naming ``path``.
    """
    raw = _read_mapping(path)
    _check_keys(raw, path, ALLOWED | {"extends"})
    if "extends" not in raw:
        return raw
    ref = raw.pop("extends")
    if not isinstance(ref, str) or not ref:
        raise SpecError(f"{path}: extends must be the path of a base spec, relative to this "
                        f"file, got {ref!r}")
    base_path = path.parent / ref
    if not base_path.is_file():
        raise SpecError(f"{path}: extends {ref}, but there is no file {base_path}")
    try:
        base = _read_mapping(base_path)
    except SpecError as err:
        raise SpecError(f"{path}: extends {ref}, but {err}") from None
    if "extends" in base:
        back = base_path.parent / str(base["extends"])
        loop = path.resolve() in (base_path.resolve(), back.resolve())
        raise SpecError(f"{path}: its base {base_path} extends {base['extends']} in turn "
                        f"({'a cycle' if loop else 'a chain'}); one level of extends only")
    _check_keys(base, base_path, ALLOWED)
    merged = {**base, **raw}
    if "profiles" in base or "profiles" in raw:
        theirs, ours = _profiles(base, base_path), _profiles(raw, path)
        merged["profiles"] = {name: {**theirs.get(name, {}), **ours.get(name, {})}
                              for name in {**theirs, **ours}}
    return merged


def _number(value: Any) -> Any:
    """A number PyYAML read as text (YAML 1.1 wants a dot: ``1e-3`` is a string, ``1.0e-3`` a
    float; main.py's configs take both) as its float; any other value as it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_spec(path: str | Path, profile: str | None = None, size: str | None = None) -> SweepSpec:
    """Read and validate a spec; ``profile`` and ``size`` override the spec's own."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"sweep spec not found: {path}")
    raw = read_spec(path)
    profile = profile or raw.get("profile", "cpu")
    overrides = _profiles(raw, path).get(profile, {})
    unknown = sorted(set(overrides) - ALLOWED)
    if unknown:
        raise SpecError(f"unknown key(s) in profiles.{profile}: {', '.join(unknown)}")
    merged = {**raw, **overrides}
    if not (ROOT / "configs" / "profiles" / f"{profile}.yaml").exists():
        raise SpecError(f"unknown profile {profile!r}: no configs/profiles/{profile}.yaml")
    size = size or merged.get("size")
    if size is not None and not (ROOT / "configs" / "sizes" / f"{size}.yaml").exists():
        raise SpecError(f"unknown size {size!r}: no configs/sizes/{size}.yaml")
    if not isinstance(merged.get("study"), str) or not merged["study"]:
        raise SpecError("study must be a non-empty name")
    check_name(merged["study"], "study", SpecError)  # runs/<study>/, results/<study>/
    grid = _check_grid(merged.get("grid"))
    grid = {key: _resolve_configs(key, values) for key, values in grid.items()}
    lr = merged.get("lr") or []
    if lr and "model.lr" in {k for key in grid for k in key.split(",")}:
        raise SpecError("the learning rate is both in the grid and the lr: sub-grid; give one")
    if isinstance(lr, list):
        lr = [_number(x) for x in lr]
    if not isinstance(lr, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and x > 0 for x in lr):
        raise SpecError(f"lr must be a list of positive numbers, got {lr!r:.80}")
    objective = merged.get("objective") or {}
    metric = objective.get("metric", "val/acc")
    if not (isinstance(metric, str) and metric.startswith(("val/acc", "val/example_acc"))):
        raise SpecError("objective.metric must be val/acc, val/example_acc (zoology's, per "
                        f"example) or one of their per-slice forms, got {metric!r}")
    direction = objective.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SpecError(f"objective.direction must be maximize or minimize, got {direction!r}")
    sampler = merged.get("sampler", "grid")
    if sampler not in SAMPLERS:
        raise SpecError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    pruner, pruner_args = _check_pruner(merged.get("pruner", "none"))
    n_trials = merged.get("n_trials")
    if sampler != "grid" and not (isinstance(n_trials, int) and n_trials > 0):
        raise SpecError(f"sampler {sampler} needs n_trials, a positive integer")
    if sampler != "grid" and merged.get("settings"):
        raise SpecError(f"settings: needs sampler: grid (every point runs at every setting; "
                        f"sampler {sampler} would tune the setting like an hparam)")
    reuse = merged.get("reuse") or []
    if not (isinstance(reuse, list) and all(isinstance(x, str) and x for x in reuse)):
        raise SpecError("reuse must be a list of study names")
    args = merged.get("args") or []
    if not isinstance(args, list):
        raise SpecError("args must be a list of main.py arguments")
    description = merged.get("description") or ""
    if not isinstance(description, str):
        raise SpecError("description must be text")
    storage = merged.get("storage")
    if storage is not None and not (isinstance(storage, str) and storage.strip()):
        # the value is not shown: it may be a URL with its password
        raise SpecError(f"{path}: storage must be a storage URL (non-empty text), got "
                        f"{'empty text' if isinstance(storage, str) else type(storage).__name__}")
    spec = SweepSpec(path=path, study=merged["study"],
                     configs=[_resolve(c) for c in merged.get("configs") or []],
                     profile=profile, grid=grid, size=size, lr=[float(x) for x in lr],
                     metric=metric, direction=direction,
                     sampler=sampler, n_trials=n_trials, pruner=pruner, pruner_args=pruner_args,
                     args=_resolve_args(args), storage=storage,
                     plots=_check_plots(merged.get("plots")),
                     claims=_check_claims(merged.get("claims")), reuse=list(reuse),
                     description=" ".join(description.split()),
                     settings=_check_settings(merged.get("settings")))
    check_run_folders(spec)
    return spec


def _texts(value: Any) -> list[str]:
    """The strings in a grid value (itself, or those in a list of values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _texts(v)]
    return []


def check_run_folders(spec: SweepSpec) -> None:
    """Every grid point's run folder (``runs/<study>/<point>/``, named by
    :func:`sweeps.names.trial_name`) is one plain folder name; a grid value with NUL or
    another control character, or a point whose name would be too long, raises
    :class:`SpecError` naming it."""
    for key, values in spec.grid.items():
        for value in values:
            for text in _texts(value):
                if any(ord(c) < 32 or ord(c) == 127 for c in text):
                    raise SpecError(f"grid.{key} value {text!r} contains NUL or another "
                                    "control character: it becomes part of a folder name")
    for point in spec.points():
        check_name(trial_name(point), "the run folder of grid point", SpecError)
