"""Sweep workers: queue the grid once, then pop and train trials until none is left.

Every grid point is queued as an Optuna WAITING trial (under a short-lived lock study, see
:func:`queue_lock`). A worker claims one by switching it to
RUNNING (an atomic compare-and-set in the storage, so two workers never take the same point),
trains it in-process through ``main.py``'s CLI with heartbeats, and records the result. Stale
trials (a dead worker's) are failed and re-queued by the storage (see ``sweeps.storage``); a
retried point is claimed before the points not yet begun and resumes from its own ``last.ckpt``.
Points whose trial raised stay failed until
``python -m sweeps run SPEC --retry-failed`` queues them again (:func:`failed_points`).
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RDBStorage, fail_stale_trials
from optuna.trial import TrialState

from arbench.noise import quiet_known_noise, quiet_resume_warning
from sweeps.faults import storage_fault
from sweeps.refs import resolve_refs
from sweeps.retry import checkpoint_progress, replay_curve, without_rungs
from sweeps.spec import SpecError, SweepSpec, make_pruner

SHORT = {"seed_everything": "seed", "model.lr": "lr", "config": "cfg"}


def short_name(key: str) -> str:
    return SHORT.get(key, key.rsplit(".", 1)[-1])


def trial_name(params: dict[str, Any]) -> str:
    """A folder name from a grid point, e.g. ``p4_seed0_lr0.003``."""
    parts = []
    for key in sorted(params):
        value = params[key]
        if key == "config" and isinstance(value, (list, tuple)):
            value = "+".join(Path(str(v)).stem for v in value)
        elif key == "config":
            value = Path(str(value)).stem
        elif isinstance(value, (list, tuple)):  # e.g. mixers [conv, delta] -> conv-delta
            value = "-".join(str(v) for v in value)
        parts.append(f"{short_name(key)}{value}")
    return "_".join(parts).replace("/", "-").replace(":", "-")


def trial_args(spec: SweepSpec, params: dict[str, Any], save_dir: str, name: str) -> list[str]:
    """``main.py`` arguments (no subcommand) of one trial: configs, size, profile, the point's
    keys."""
    args: list[str] = []
    for cfg in spec.configs:
        args += ["--config", cfg]
    if "config" in params:  # one config file, or a list of them that compose
        cfgs = params["config"]
        for cfg in cfgs if isinstance(cfgs, (list, tuple)) else [cfgs]:
            args += ["--config", str(cfg)]
    if spec.size_path:
        args += ["--config", spec.size_path]
    args += ["--config", spec.profile_path, *spec.args]
    for key, value in params.items():
        if key != "config":  # strings go bare: jsonargparse would keep JSON's quotes
            args.append(f"--{key}={value if isinstance(value, str) else json.dumps(value)}")
    args += [f"--trainer.logger.init_args.save_dir={save_dir}",
             f"--trainer.logger.init_args.name={name}",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    return args


def quiet_libraries() -> None:
    """Trials print one line each; silence the libraries' per-run chatter."""
    import lightning.pytorch  # noqa: F401  (configures its loggers on import; override after)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=".*args parameter is intended")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    quiet_known_noise()


def make_sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    """The spec's sampler for asking new points (grid points are enqueued, not sampled)."""
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=0)
    return optuna.samplers.RandomSampler(seed=0)


def study_pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    """The spec's pruner; on a grid, deciding within each bracket (``sweeps.pruning``)."""
    pruner = make_pruner(spec.pruner, spec.pruner_args)
    if spec.sampler == "grid" and spec.pruner != "none":
        from sweeps.pruning import BracketPruner

        return BracketPruner(pruner, grid_lrs=spec.lr or None)
    return pruner


def make_study(spec: SweepSpec, storage: RDBStorage) -> optuna.Study:
    """Create (or open) the spec's study with its sampler and pruner."""
    study = optuna.create_study(study_name=spec.study, storage=storage,
                                sampler=make_sampler(spec),
                                pruner=study_pruner(spec), direction=spec.direction,
                                load_if_exists=True)
    study.set_user_attr("spec", str(spec.path))
    study.set_user_attr("profile", spec.profile)
    return study


def validate_points(spec: SweepSpec) -> None:
    """Instantiate model and data of every distinct grid point; bad values raise SpecError."""
    from arbench.cli import CliError, build_cli

    seen = set()
    with tempfile.TemporaryDirectory() as tmp:
        for point in spec.points():
            key = json.dumps({k: v for k, v in point.items()
                              if k not in ("seed_everything", "model.lr")}, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            try:
                build_cli(trial_args(spec, point, tmp, "check"), run=False)
            except CliError as err:
                raise SpecError(f"grid point {key}: {err}") from None
            except SystemExit:
                raise SpecError(f"grid point {key} is not a valid main.py configuration "
                                "(see the message above)") from None


LOCK_PREFIX = "_arbench_lock::"  # internal; exists only while one process queues


def is_lock_study(name: str) -> bool:
    """A queueing lock, not a user's study (``::grid::`` ones are left by older versions)."""
    return name.startswith(LOCK_PREFIX) or "::grid::" in name
OPEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


@contextmanager
def queue_lock(storage: RDBStorage, study_name: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the study's queueing lock: the study ``_arbench_lock::<study>``, created (study
    names are unique in the storage, so one process wins) and deleted again on exit. It never
    stays beside the user's studies; one left by a killed holder is taken over after
    ``timeout`` seconds."""
    name = f"{LOCK_PREFIX}{study_name}"
    deadline = time.time() + timeout
    while True:
        try:
            optuna.create_study(study_name=name, storage=storage)
            break
        except optuna.exceptions.DuplicatedStudyError:
            if time.time() > deadline:
                break  # its holder died while queueing
            time.sleep(0.2)
    try:
        yield
    finally:
        try:
            optuna.delete_study(study_name=name, storage=storage)
        except KeyError:
            pass


def grid_point(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The grid point a trial runs (queued as ``fixed_params``)."""
    return trial.system_attrs.get("fixed_params") or trial.params


def failed_points(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The latest failed trial of every point that has failed and has no trial complete,
    pruned, running or waiting: the points a ``--retry-failed`` run queues again."""
    by_point: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for trial in study.get_trials(deepcopy=False):
        by_point.setdefault(json.dumps(grid_point(trial), sort_keys=True), []).append(trial)
    return [max((t for t in trials if t.state == TrialState.FAIL), key=lambda t: t.number)
            for trials in by_point.values()
            if not any(t.state in OPEN for t in trials)
            and any(t.state == TrialState.FAIL for t in trials)]


def requeue(study: optuna.Study, failed: optuna.trial.FrozenTrial) -> None:
    """Queue a fresh WAITING trial of the failed trial's point, as the storage does for a
    stale trial (same params and ``fixed_params``, ``failed_trial`` naming the old one, no rung
    values: ``sweeps.retry``)."""
    user_attrs = {k: v for k, v in failed.user_attrs.items() if k != "fail_reason"}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=failed.params, distributions=failed.distributions,
        user_attrs=user_attrs, system_attrs={**without_rungs(failed.system_attrs),
                                             "failed_trial": failed.number}))


def drop_legacy_locks(storage: RDBStorage, study_name: str) -> None:
    """Delete the ``<study>::grid::<hash>`` lock studies older versions left for good."""
    for name in optuna.get_all_study_names(storage):
        if name.startswith(f"{study_name}::grid::"):
            optuna.delete_study(study_name=name, storage=storage)


def enqueue_grid(study: optuna.Study, spec: SweepSpec, storage: RDBStorage,
                 retry_failed: bool = False) -> tuple[int, int]:
    """Queue every grid point that has no trial yet and, with ``retry_failed``, every failed
    point again; returns ``(queued, requeued)``. Under :func:`queue_lock`, so concurrent
    starts never queue a point twice. A spec that gained a config (or another categorical
    value) since the study began has it added to the recorded choices first
    (:mod:`sweeps.grow`)."""
    from sweeps.grow import extend_categorical_params

    with queue_lock(storage, spec.study):
        drop_legacy_locks(storage, spec.study)
        extend_categorical_params(storage, spec.study, spec.choices())
        existing = [grid_point(t) for t in study.get_trials(deepcopy=False)]
        new = [point for point in spec.points() if point not in existing]
        reused = reuse_points(study, spec, new, storage)
        for i, point in enumerate(new):
            if i not in reused:
                study.enqueue_trial(point, skip_if_exists=False)
        failed = failed_points(study) if retry_failed else []
        for trial in failed:
            requeue(study, trial)
    return len(new) - len(reused), len(failed)


def reuse_points(study: optuna.Study, spec: SweepSpec, points: list[dict[str, Any]],
                 storage: RDBStorage) -> dict[int, Any]:
    """Record the ``points`` a finished run of a ``reuse:`` study stands for
    (:mod:`sweeps.reuse`) as complete trials; returns them by index."""
    if not spec.reuse or not points:
        return {}
    from sweeps.reuse import matches, reuse_trial

    found = matches(spec, points, storage)
    choices, recorded = spec.choices(), recorded_distributions(study)
    for i, source in found.items():
        point = points[i]
        dists = {k: fixed_distribution(v, list(choices.get(k, [])), recorded.get(k))
                 for k, v in point.items()}
        study.add_trial(reuse_trial(point, source, dists))
    if found:
        names = sorted({f"{s}#{t.number}" for s, t in found.values()})
        print(f"reused {len(found)} finished run(s): {', '.join(names)}", flush=True)
    return found


def claim_waiting(study: optuna.Study, storage: RDBStorage) -> int | None:
    """Switch a WAITING trial to RUNNING; the storage guarantees one winner. Retries (trials
    with ``failed_trial``: a killed run queued again, or ``--retry-failed``) go first, oldest
    first, since they resume a run already begun from its ``last.ckpt``; then the queue in its
    order, so a sweep stopped and restarted keeps the order its spec set.

    The heartbeat is recorded before the claim: Optuna never fails a RUNNING trial that has no
    heartbeat, so a worker killed between claiming and its first beat would block the sweep.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    for frozen in sorted(waiting, key=lambda t: ("failed_trial" not in t.system_attrs, t.number)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        try:
            storage.record_heartbeat(trial_id)
            if storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                return trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


class Heartbeat:
    """Records the trial's heartbeat every ``interval`` seconds from a daemon thread."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval: float):
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self.stop.is_set():
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a missed beat is retried; staleness needs many in a row
                pass
            self.stop.wait(self.interval)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fixed_distribution(value: Any, options: list[Any], recorded: Any) -> Any:
    """The distribution a queued grid value is recorded with. Numbers get a one-value int or
    float distribution, which Optuna lets differ between trials, so a study can later gain
    lrs or seeds (:mod:`sweeps.widen`); other values (config paths) are categorical over the
    spec's ``options``. ``recorded``: the key's distribution in the study so far, if any (a
    study made before numbers were recorded so keeps its categorical choices)."""
    if is_number(value) and not isinstance(recorded, CategoricalDistribution):
        if isinstance(value, int):
            return IntDistribution(value, value)
        return FloatDistribution(float(value), float(value))
    if isinstance(recorded, CategoricalDistribution):
        options = list(recorded.choices)
    return CategoricalDistribution(options if value in options else [*options, value])


def suggest_fixed(trial: optuna.Trial, key: str, value: Any, options: list[Any],
                  recorded: Any) -> Any:
    """Record a queued grid value with :func:`fixed_distribution`."""
    dist = fixed_distribution(value, options, recorded)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, value, value)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(key, value, value)
    return trial.suggest_categorical(key, list(dist.choices))


def recorded_distributions(study: optuna.Study) -> dict[str, Any]:
    """Each param's distribution in the study's earliest trial that has it."""
    out: dict[str, Any] = {}
    for t in study.get_trials(deepcopy=False):
        for key, dist in t.distributions.items():
            out.setdefault(key, dist)
    return out


def point_params(trial: optuna.Trial, spec: SweepSpec, storage: RDBStorage) -> dict[str, Any]:
    """The trial's grid point, recorded as Optuna params (kept as-is for a retried trial)."""
    frozen = storage.get_trial(trial._trial_id)
    params = dict(frozen.params)
    fixed = frozen.system_attrs.get("fixed_params") or {}
    choices = spec.choices()
    recorded = recorded_distributions(trial.study) if fixed else {}
    for key in fixed or choices:
        if key in params:
            continue
        if key in fixed:
            params[key] = suggest_fixed(trial, key, fixed[key], list(choices.get(key, [])),
                                        recorded.get(key))
        else:
            params[key] = trial.suggest_categorical(key, choices[key])
    return params


def point_problem(params: dict[str, Any], spec: SweepSpec) -> str | None:
    """Why the queued point ``params`` is not one of the spec's, or None. Every key must be a
    grid key of the spec and every value that is not a number one of the spec's values for it
    (numbers may differ: ``--widen`` adds lrs, a grown grid adds seeds). A point from a
    restored archive can therefore never pass ``main.py`` an option, a config file or a class
    path the spec does not name."""
    choices = spec.choices()
    for key, value in params.items():
        if key not in choices:
            return f"its grid point sets {key}, which is not a grid key of {spec.path}"
        if not is_number(value) and value not in choices[key]:
            return f"its grid point's {key}={value!r:.80} is not a value {spec.path} lists"
    return None


def record_pruned(trial: optuna.Trial, storage: RDBStorage, log_dir: Path,
                  wall_time_s: float) -> None:
    """What a run the pruner stopped had done: its validations (``val_curve``, (step, value)
    pairs of the objective), the step it stopped at, its wall time, and what its
    ``summary.json`` holds when the run wrote one (hparams, slices, device)."""
    reached = sorted(storage.get_trial(trial._trial_id).intermediate_values.items())
    trial.set_user_attr("val_curve", [[int(s), v] for s, v in reached])
    if reached:
        trial.set_user_attr("global_step", int(reached[-1][0]))
    trial.set_user_attr("wall_time_s", wall_time_s)
    trial.set_user_attr("log_dir", str(log_dir))
    summary = log_dir / "summary.json"
    if summary.is_file():
        saved = json.loads(summary.read_text())
        for key in ("hparams", "slices", "device", "collapsed_at", "example_acc",
                    "example_slices"):
            trial.set_user_attr(key, saved.get(key))


def run_trial(study: optuna.Study, trial: optuna.Trial, spec: SweepSpec, storage: RDBStorage,
              runs_root: Path, log: Any) -> None:
    """Train one point in-process and record its result (or its failure) on the trial."""
    from arbench.ckpt_check import last_checkpoint
    from arbench.cli import build_cli, checkpoints_by_run_name
    from arbench.summary import summary_value

    params = point_params(trial, spec, storage)
    problem = point_problem(params, spec)
    if problem is not None:
        trial.set_user_attr("fail_reason", problem)
        study.tell(trial, state=TrialState.FAIL)
        log(f"trial {trial.number}: FAILED ({problem})")
        return
    name = trial_name(params)
    save_dir = runs_root / spec.study
    last = last_checkpoint(save_dir / name / "checkpoints")  # as main.py's --ckpt_path last
    ckpt = str(last) if last is not None else None
    trial.set_user_attr("run_name", name)
    log(f"trial {trial.number} {name}: start" + (f" (resuming {last.name})" if last else ""))
    if ckpt:
        quiet_resume_warning()
    t0 = time.time()
    earlier_s = 0.0  # a resumed run's training time before its checkpoint

    def spent() -> float:
        """The run's wall time in seconds: this attempt's, plus what it resumes from."""
        return earlier_s + time.time() - t0

    try:
        if ckpt:
            resumed_step, earlier_s = checkpoint_progress(ckpt)
        resolved = resolve_refs(params, storage)  # best:<study> values -> checkpoints
        cli = build_cli(trial_args(spec, resolved, str(save_dir), name), run=False)
        trainer = cli.trainer
        checkpoints_by_run_name(trainer)
        if spec.pruner != "none":
            from sweeps.pruning import StepPruningCallback

            trainer.callbacks.append(StepPruningCallback(trial, monitor=spec.metric))
            if ckpt:  # the rungs the run passed before it stopped, judged again
                replay_curve(trial, resumed_step)
        Path(trainer.log_dir).mkdir(parents=True, exist_ok=True)
        config_text = cli.parser.dump(cli.config, skip_none=False)
        (Path(trainer.log_dir) / "config.yaml").write_text(config_text)
        trial.set_user_attr("config", config_text)  # reuse needs it once runs/ is gone
        # tensors only, as read_checkpoint read it above (a pickle could run code)
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt, weights_only=True)
        summary = json.loads((Path(trainer.log_dir) / "summary.json").read_text())
    except optuna.TrialPruned:
        record_pruned(trial, storage, Path(trainer.log_dir), spent())
        study.tell(trial, state=TrialState.PRUNED)
        log(f"trial {trial.number} {name}: pruned after {spent():.0f} s")
        return
    except Exception as err:
        if storage_fault(err) is not None:
            raise  # the database's fault, not the trial's: it stays running, resumed later
        trial.set_user_attr("fail_reason", one_line(err))
        study.tell(trial, state=TrialState.FAIL)
        log(f"trial {trial.number} {name}: FAILED ({one_line(err)})")
        return
    value = summary_value(summary, spec.metric)
    for key in ("slices", "hparams", "best_checkpoint", "last_checkpoint", "log_dir",
                "global_step", "last_val_acc", "converged", "collapsed_at", "val_curve", "device",
                "example_acc", "last_example_acc", "example_slices"):
        trial.set_user_attr(key, summary.get(key))
    trial.set_user_attr("val_acc", summary["val_acc"])
    trial.set_user_attr("state_size", summary["hparams"].get("state_size"))
    trial.set_user_attr("params", summary["hparams"].get("params"))
    trial.set_user_attr("wall_time_s", spent())
    if value is None:
        trial.set_user_attr("fail_reason", f"no {spec.metric} was logged")
        study.tell(trial, state=TrialState.FAIL)
        return
    study.tell(trial, value)
    log(f"trial {trial.number} {name}: {spec.metric} {value:.4f} in {spent():.0f} s")


def work(spec: SweepSpec, storage: RDBStorage, runs_root: Path, worker: str,
         poll: float = 2.0, max_trials: int | None = None) -> int:
    """Run trials until the study has none waiting or running; returns trials run here."""
    quiet_libraries()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {worker}] {msg}", flush=True)

    study = optuna.load_study(study_name=spec.study, storage=storage, sampler=make_sampler(spec),
                              pruner=study_pruner(spec))
    done = 0
    while max_trials is None or done < max_trials:
        fail_stale_trials(study)
        if spec.sampler == "grid":
            trial_id = claim_waiting(study, storage)
            if trial_id is None:
                if study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    time.sleep(poll)  # another worker's trial may still go stale
                    continue
                break
            trial = optuna.Trial(study, trial_id)
        else:
            started = study.get_trials(deepcopy=False, states=(
                TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED, TrialState.FAIL))
            if len(started) >= (spec.n_trials or 0):
                break
            trial = study.ask()
        with Heartbeat(storage, trial._trial_id, storage.get_heartbeat_interval() or 30):
            try:
                run_trial(study, trial, spec, storage, runs_root, log)
            except optuna.exceptions.UpdateFinishedTrialError:
                # Its heartbeat went stale (e.g. the machine stalled) and another worker failed
                # and re-queued it; the retry resumes from this run's last.ckpt.
                log(f"trial {trial.number}: was failed as stale elsewhere; result not recorded")
        done += 1
    return done
