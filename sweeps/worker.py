"""Sweep workers: claim queued trials and train them until none is left.

A worker claims a WAITING trial (queued by :mod:`sweeps.queue`) by switching it to RUNNING (an
atomic compare-and-set in the storage, so two workers never take the same point), trains it
in-process through ``main.py``'s CLI with heartbeats, and records the result. Stale trials (a
dead worker's) are failed and re-queued by the storage (see ``sweeps.storage``); a retried
point is claimed before the points not yet begun and resumes from its own ``last.ckpt``.
A sampled (not grid) sweep's worker runs queued trials the same way and asks the sampler
for a new point (:func:`ask_new`) only while the study has fewer than ``n_trials`` (a killed
run and its retry count once). Points whose trial raised stay failed until
``python -m sweeps run SPEC --retry-failed`` queues them again
(:func:`sweeps.trials.failed_points`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage, fail_stale_trials
from optuna.trial import TrialState

from arbench.noise import quiet_lightning_loggers, quiet_resume_warning, quiet_sweep_noise
from arbench.objective import summary_value
from sweeps.command import trial_args
from sweeps.faults import storage_fault
from sweeps.names import trial_name
from sweeps.params import point_params, point_problem
from sweeps.refs import resolve_refs
from sweeps.retry import checkpoint_progress, replay_curve
from sweeps.reuse import fill_from, same_experiments
from sweeps.runtime import expected_seconds, timed_runs
from sweeps.spec import SweepSpec
from sweeps.study import load_study
from sweeps.trials import counted_runs


def claim_waiting(study: optuna.Study, storage: RDBStorage,
                  fits: Callable[[optuna.trial.FrozenTrial], bool] | None = None) -> int | None:
    """Switch a WAITING trial to RUNNING; the storage guarantees one winner. Retries (trials
    with ``failed_trial``: a killed run queued again, or ``--retry-failed``) go first, oldest
    first, since they resume a run already begun from its ``last.ckpt``; then the queue in its
    order, so a sweep stopped and restarted keeps the order its spec set. ``fits``: only
    trials it accepts are claimed (a deadline's: those expected to end before it).

    The heartbeat is recorded before the claim: Optuna never fails a RUNNING trial that has no
    heartbeat, so a worker killed between claiming and its first beat would block the sweep.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    for frozen in sorted(waiting, key=lambda t: ("failed_trial" not in t.system_attrs, t.number)):
        if fits is not None and not fits(frozen):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        try:
            storage.record_heartbeat(trial_id)
            if storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                return trial_id
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def ask_new(study: optuna.Study, storage: RDBStorage) -> optuna.Trial | None:
    """A new trial for the sampler to pick a point for, as ``study.ask()`` makes one, but with
    its heartbeat recorded before it is RUNNING (as :func:`claim_waiting` does): created
    WAITING, beaten, then switched to RUNNING, so a worker killed at any step leaves a trial
    that goes stale (or stays queued), never one RUNNING with no heartbeat. None when another
    worker claimed it first: it runs there."""
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.create_new_trial(
        study_id, template_trial=optuna.trial.create_trial(state=TrialState.WAITING))
    storage.record_heartbeat(trial_id)
    try:
        if not storage.set_trial_state_values(trial_id, TrialState.RUNNING):
            return None
    except optuna.exceptions.UpdateFinishedTrialError:
        return None
    study._thread_local.cached_all_trials = None  # as ask() does: the sampler reads afresh
    return optuna.Trial(study, trial_id)


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


def record_pruned(trial: optuna.Trial, storage: RDBStorage, log_dir: Path,
                  wall_time_s: float) -> None:
    """What a run the pruner stopped had done: its validations (``val_curve``, (step, value)
    pairs of the objective, as its intermediate values: ``val/acc`` only where that is the
    objective; :func:`sweeps.trials.objective_curve` reads them), the step it stopped at, its
    wall time, and what its ``summary.json`` holds when the run wrote one (hparams, slices,
    device)."""
    reached = sorted(storage.get_trial(trial._trial_id).intermediate_values.items())
    trial.set_user_attr("val_curve", [[int(s), v] for s, v in reached])
    if reached:
        trial.set_user_attr("global_step", int(reached[-1][0]))
    trial.set_user_attr("wall_time_s", wall_time_s)
    trial.set_user_attr("log_dir", str(log_dir))
    summary = log_dir / "summary.json"
    if summary.is_file():
        saved = json.loads(summary.read_text())
        for key in ("hparams", "slices", "device", "collapsed_at", "val_acc", "last_val_acc",
                    "example_acc", "last_example_acc", "example_slices", "loss_curve"):
            trial.set_user_attr(key, saved.get(key))


def run_trial(study: optuna.Study, trial: optuna.Trial, spec: SweepSpec, storage: RDBStorage,
              runs_root: Path, log: Any) -> None:
    """Train one point in-process and record its result (or its failure) on the trial."""
    # here: keeps Lightning out of CLI start-up
    from arbench.ckpt_check import last_checkpoint
    from arbench.cli import build_cli, checkpoints_by_run_name
    from arbench.lit import DivergenceError

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
    if ckpt is None:  # finished by a reuse: study since it was queued (sweeps.reuse)
        found = same_experiments(spec, [params], storage).get(0)
        if found is not None:
            fill_from(trial, found, storage)
            log(f"trial {trial.number} {name}: reused {found.study}#{found.trial.number} "
                f"({found.trial.state.name.lower()}), not trained")
            return
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
            from sweeps.pruning import StepPruningCallback, before_checkpoints  # here: Lightning

            before_checkpoints(trainer.callbacks, StepPruningCallback(trial, monitor=spec.metric))
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
        summary_path = Path(trainer.log_dir) / "summary.json" \
            if isinstance(err, DivergenceError) else None
        if summary_path is None or not summary_path.is_file():
            trial.set_user_attr("fail_reason", one_line(err))
            study.tell(trial, state=TrialState.FAIL)
            log(f"trial {trial.number} {name}: FAILED ({one_line(err)})")
            return
        # Diverged after a validation: the run's result is the best it reached before, as
        # for a collapsed run, flagged; leaving it out would average its lr over the seeds
        # that did not diverge (and --widen would queue that lr again and again).
        summary = json.loads(summary_path.read_text())
        trial.set_user_attr("diverged", one_line(err))
        log(f"trial {trial.number} {name}: diverged ({one_line(err)}); counted at its best "
            f"validation before it")
    value = summary_value(summary, spec.metric)
    for key in ("slices", "hparams", "best_checkpoint", "last_checkpoint", "log_dir",
                "global_step", "last_val_acc", "converged", "collapsed_at", "val_curve", "device",
                "example_acc", "last_example_acc", "example_slices", "example_curve",
                "loss_curve"):
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


class Deadline:
    """``sweeps run --until``: which queued runs are expected to end before ``until`` (epoch
    seconds), by the bound of :func:`sweeps.runtime.expected_seconds` (``conservative``) over
    the study's finished runs. A run with nothing to time it by (no completed run yet) is
    started."""

    def __init__(self, until: float, trials: list[optuna.trial.FrozenTrial]) -> None:
        self.until, self.timed = until, timed_runs(trials)

    def fits(self, trial: optuna.trial.FrozenTrial) -> bool:
        seconds = expected_seconds(trial, self.timed, conservative=True)
        return seconds is None or time.time() + seconds <= self.until

    def stop_line(self, waiting: list[optuna.trial.FrozenTrial]) -> str:
        """Why the worker stops while ``waiting`` is queued."""
        shortest = min(expected_seconds(t, self.timed, conservative=True) or 0.0
                       for t in waiting)
        at = time.strftime("%H:%M", time.localtime(self.until))
        return (f"stopping before {at}: none of the {len(waiting)} queued run(s) is expected "
                f"to end by then (the shortest takes ~{shortest / 60:.0f} min by the study's "
                "finished runs); the same command resumes the sweep")


def work(spec: SweepSpec, storage: RDBStorage, runs_root: Path, worker: str,
         poll: float = 2.0, max_trials: int | None = None, until: float | None = None) -> int:
    """Run trials until the study has none waiting or running (a sampled sweep: and has its
    ``n_trials``, :func:`sweeps.trials.counted_runs`); returns trials run here. A running
    trial is waited for, since it may go stale and be queued again. ``until`` (epoch
    seconds): start only the queued runs expected to end by then (:class:`Deadline`), and
    stop when none is."""
    quiet_sweep_noise()
    quiet_lightning_loggers()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {worker}] {msg}", flush=True)

    study = load_study(spec, storage)
    done = 0
    while max_trials is None or done < max_trials:
        fail_stale_trials(study)
        deadline = None if until is None else Deadline(until, study.get_trials(deepcopy=False))
        # Queued trials first, a killed run's retry before the rest; a sampled sweep's too.
        trial_id = claim_waiting(study, storage, deadline.fits if deadline else None)
        if trial_id is not None:
            trial = optuna.Trial(study, trial_id)
        else:
            trials = study.get_trials(deepcopy=False)
            waiting = [t for t in trials if t.state == TrialState.WAITING]
            if deadline is not None and waiting:
                log(deadline.stop_line(waiting))
                break
            if spec.sampler == "grid" or len(counted_runs(trials)) >= (spec.n_trials or 0):
                if any(t.state == TrialState.RUNNING for t in trials):
                    time.sleep(poll)  # another worker's trial may still go stale: its retry
                    continue  # is queued in its place and runs here
                break
            unsampled = optuna.trial.create_trial(state=TrialState.WAITING)  # timed by every run
            if deadline is not None and not deadline.fits(unsampled):
                log(deadline.stop_line([unsampled]))
                break
            trial = ask_new(study, storage)
            if trial is None:
                continue
        with Heartbeat(storage, trial._trial_id, storage.get_heartbeat_interval() or 30):
            try:
                run_trial(study, trial, spec, storage, runs_root, log)
            except optuna.exceptions.UpdateFinishedTrialError:
                # Its heartbeat went stale (e.g. the machine stalled) and another worker failed
                # and re-queued it; the retry resumes from this run's last.ckpt.
                log(f"trial {trial.number}: was failed as stale elsewhere; result not recorded")
        done += 1
    return done

