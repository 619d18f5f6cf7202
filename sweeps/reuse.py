"""Reusing finished runs of other studies (a spec's ``reuse: [study, ...]``).

A grid point whose run would be the same experiment as a finished run of a named study is
recorded from that run instead of trained again: its value, curves and checkpoints, with
``reused_from: <study>#<trial>``. Two runs are the same experiment when their resolved
``main.py`` configurations are equal, both parsed by the current code (so a key added since
the earlier run counts at its default): model, data, trainer budget and callbacks, seed.
The run's name, output folder and console options do not count. A point that names another
study's run (``best:<study>``) is never reused.

A run the source study's pruner stopped stands for its point too, in a study that prunes
(``pruner:`` set; the shipped studies that reuse pruned runs share one halving rule): it comes
as a PRUNED trial with its curve and its rung values (``completed_rung_*``), so the new runs of
its bracket are weighed against the same rung values as in the source study, and a bracket
reused whole is decided as it was there. A study without a pruner trains those points, and so
does a grid study at an lr beyond its ``lr:`` sub-grid (``--widen``'s), which its pruner never
stops (:func:`runs_whole_budget`).

A reused run is valued by the reusing study's objective, as the run recorded it (its summary:
``val_acc``, ``example_acc``, per slice). Where the source study's objective is another metric
(``calibration_long_6k`` judged by ``val/acc``, the long studies by zoology's), only a completed
run is reused, without its curve and rung values, which are in that other metric.

Points are looked up when they are queued and again when a worker reaches them
(:func:`fill_from`): a queued point whose experiment a ``reuse:`` study has finished since (two
studies that reuse each other, each running some of the shared points) is recorded from that run
then, not trained twice. A point already begun (it has a ``last.ckpt``) carries on.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import optuna
import torch
from optuna.trial import TrialState

from arbench.defaults import DEFAULT_PRECISION
from arbench.objective import ACC, summary_value
from sweeps.command import trial_args
from sweeps.spec import SweepSpec
from sweeps.trials import LR, RESULTS, beyond_grid, study_metric

IGNORED = (("trainer", "logger"), ("trainer", "enable_progress_bar"),
           ("trainer", "enable_model_summary"), ("config",), ("ckpt_path",),
           ("checkpoint", "dirpath"))
"""Config entries that name where and how a run prints, not what it trains."""


def _parse_only_cli(args: list[str]) -> Any:
    """``main.py``'s parser over ``args`` (no subcommand), nothing checked or built."""
    from arbench.cli import ArbenchCLI, build_cli  # here: keeps Lightning out of CLI start-up

    class ParseOnly(ArbenchCLI):
        def instantiate_classes(self) -> None:
            pass

        def _set_seed(self) -> None:
            pass

    with torch.random.fork_rng(devices=[]):
        return build_cli(args, run=False, cli_class=ParseOnly)


DEFAULT_PRECISIONS = (None, "32", 32, "32-true")
"""``trainer.precision`` values that all train in fp32 (unset: Lightning's ``32-true``)."""


def experiment(args: list[str]) -> str:
    """The resolved configuration of ``main.py`` ``args`` less :data:`IGNORED`, as a
    canonical JSON string; a precision of :data:`DEFAULT_PRECISIONS` counts as ``32-true``."""
    config = _parse_only_cli(args).config.as_dict()
    trainer = config.get("trainer")
    if isinstance(trainer, dict) and trainer.get("precision") in DEFAULT_PRECISIONS:
        trainer["precision"] = DEFAULT_PRECISION
    for path in IGNORED:
        node = config
        for key in path[:-1]:
            node = node.get(key) or {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return json.dumps(config, sort_keys=True, default=str)


def saved_experiment(trial: optuna.trial.FrozenTrial) -> str | None:
    """:func:`experiment` of a finished trial's saved configuration: the ``config`` the worker
    recorded on the trial (it survives an archive and a lost ``runs/``), else the run folder's
    ``config.yaml``; None when neither is there."""
    text = trial.user_attrs.get("config")
    if text:
        with tempfile.TemporaryDirectory() as tmp:
            saved = Path(tmp) / "config.yaml"
            saved.write_text(str(text))
            return experiment(["--config", str(saved)])
    saved = Path(str(trial.user_attrs.get("log_dir") or "")) / "config.yaml"
    return experiment(["--config", str(saved)]) if saved.is_file() else None


_NOTED: set[str] = set()
"""Reuse studies already noted as not run, by name."""

_SAVED: dict[tuple[int, str, str], str | None] = {}
""":func:`saved_experiment` of finished trials by (trial id, storage URL, the configuration or
run folder it saved): a finished trial's configuration never changes, and a worker looks the
reuse studies up before every point; a deleted study's trial ids go to new trials again."""


class Source(NamedTuple):
    """A finished run that stands for a point: its study's name, its trial, its value under the
    reusing study's objective (None for a run the pruner stopped), and whether its curve and
    rung values are in that objective too (its study's metric is the same), so carry over."""

    study: str
    trial: optuna.trial.FrozenTrial
    value: float | None
    curves: bool


def finished_experiments(study_names: list[str], storage: Any, metric: str = ACC,
                         pruned: bool = False) -> dict[str, Source]:
    """``{experiment: Source}`` of the completed runs of ``study_names`` that recorded
    ``metric`` and, with ``pruned``, the pruned ones that reached a validation in a study whose
    objective is ``metric`` (each from its saved configuration, :func:`saved_experiment`; runs
    with none, or whose configuration no longer parses, are skipped)."""
    known = set(optuna.get_all_study_names(storage))
    out: dict[str, Source] = {}
    for name in study_names:
        if name not in known:
            if name not in _NOTED:  # once per process: a worker looks again before each point
                _NOTED.add(name)
                print(f"note: reuse: study {name} has not run in this storage; points it "
                      f"has not finished when a worker reaches them are trained",
                      file=sys.stderr, flush=True)
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        same = study_metric(study.user_attrs, trials) == metric
        states = RESULTS if pruned and same else (TrialState.COMPLETE,)
        for t in (t for t in trials if t.state in states):
            if t.user_attrs.get("reused_from") or (t.state == TrialState.PRUNED
                                                   and not t.intermediate_values):
                continue
            value = None
            if t.state == TrialState.COMPLETE:
                value = t.value if same else summary_value(t.user_attrs, metric)
                if value is None:
                    continue
            cache_key = (t._trial_id, str(getattr(storage, "url", storage)),
                         str(t.user_attrs.get("config") or t.user_attrs.get("log_dir")))
            if cache_key not in _SAVED:
                try:
                    _SAVED[cache_key] = saved_experiment(t)
                except (SystemExit, Exception):  # an old run's keys this code no longer takes
                    _SAVED[cache_key] = None
            key = _SAVED[cache_key]
            if key is not None:
                out.setdefault(key, Source(name, t, value, same))
    return out


def carried_attrs(source: Source) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a reused run carries over from ``source``: its user attrs with ``reused_from``,
    and its rung values (the ``completed_rung_*`` system attrs) where they are in the reusing
    study's objective."""
    done = source.trial
    rungs = {k: v for k, v in done.system_attrs.items()
             if k.startswith("completed_rung_")} if source.curves else {}
    return {**done.user_attrs, "reused_from": f"{source.study}#{done.number}"}, rungs


def reuse_trial(point: dict[str, Any], source: Source,
                distributions: dict[str, Any]) -> optuna.trial.FrozenTrial:
    """A trial for ``point`` holding the result of ``source``: its state (COMPLETE or
    PRUNED), value, and curve and rung values where they are in this study's objective."""
    done = source.trial
    user_attrs, rungs = carried_attrs(source)
    return optuna.trial.create_trial(
        state=done.state, value=source.value if done.state == TrialState.COMPLETE else None,
        params=point, distributions=distributions,
        intermediate_values=dict(done.intermediate_values) if source.curves else {},
        user_attrs=user_attrs, system_attrs={**rungs, "fixed_params": point})


def runs_whole_budget(spec: SweepSpec, point: dict[str, Any]) -> bool:
    """Whether ``spec``'s pruner never stops ``point``'s run: on a grid, an lr beyond the spec's
    ``lr:`` sub-grid (``--widen``'s), as :meth:`sweeps.pruning.BracketPruner.widened` says."""
    return spec.sampler == "grid" and beyond_grid(point.get(LR), spec.lr or None)


def same_experiments(spec: SweepSpec, points: list[dict[str, Any]],
                     storage: Any) -> dict[int, Source]:
    """``{index in points: Source}`` for the points a finished run stands for (the same
    experiment, :func:`experiment`), valued by ``spec``'s objective; a pruned run never
    stands for a point this study's pruner would not stop (:func:`runs_whole_budget`)."""
    if not spec.reuse:
        return {}
    done = finished_experiments(spec.reuse, storage, spec.metric, pruned=spec.pruner != "none")
    out = {}
    for i, point in enumerate(points):
        if any(str(v).startswith("best:") for v in point.values()):
            continue
        found = done.get(experiment(trial_args(spec, point, "runs", "reuse")))
        if found is not None and not (found.trial.state == TrialState.PRUNED
                                      and runs_whole_budget(spec, point)):
            out[i] = found
    return out


def fill_from(trial: optuna.Trial, source: Source, storage: Any) -> None:
    """Record on ``trial`` (claimed, RUNNING) the result of ``source``, as :func:`reuse_trial`
    records it on a new trial: its user attrs with ``reused_from``, its curve and rung values
    where they are in this study's objective, then its state (COMPLETE with its value, or
    PRUNED)."""
    done = source.trial
    trial_id = trial._trial_id
    user_attrs, rungs = carried_attrs(source)
    for key, value in user_attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    for key, value in rungs.items():
        storage.set_trial_system_attr(trial_id, key, value)
    if source.curves:
        for step, value in done.intermediate_values.items():
            storage.set_trial_intermediate_value(trial_id, step, value)
    if done.state == TrialState.COMPLETE:
        storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [source.value])
    else:
        storage.set_trial_state_values(trial_id, TrialState.PRUNED)
