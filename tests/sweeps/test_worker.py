import sys
import time
from contextlib import nullcontext

import optuna
import pytest
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState
from test_sweeps import write_spec

import sweeps.worker
from sweeps.spec import load_spec
from sweeps.storage import open_storage
from sweeps.study import make_study
from sweeps.worker import claim_waiting, work


def test_worker_killed_right_after_its_claim_is_retried(tmp_path):
    """The worker dies between claiming a point and its heartbeat thread's first beat: after
    the grace period the trial is failed and its point queued again, not left RUNNING."""
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat=1, grace=1)
    study = optuna.create_study(study_name="claim", storage=storage)
    study.enqueue_trial({"x": 1})
    trial_id = claim_waiting(study, storage)
    assert storage.get_trial(trial_id).state == TrialState.RUNNING
    time.sleep(2.5)
    fail_stale_trials(study)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    assert study.get_trials()[1].system_attrs["fixed_params"] == {"x": 1}


def test_a_killed_run_queued_again_is_claimed_before_the_rest_of_the_queue(tmp_path):
    """The retry of a stale trial sits at the queue's end; it is claimed first (it resumes a
    run already begun), then the queue in its order."""
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat=1, grace=1)
    study = optuna.create_study(study_name="order", storage=storage)
    for x in range(3):
        study.enqueue_trial({"x": x})
    killed = claim_waiting(study, storage)  # x=0, its worker dies
    time.sleep(2.5)
    fail_stale_trials(study)  # x=0 queued again as trial 3, after x=1 and x=2
    order = [claim_waiting(study, storage) for _ in range(3)]
    points = [storage.get_trial(i).system_attrs["fixed_params"]["x"] for i in order]
    assert storage.get_trial(order[0]).system_attrs["failed_trial"] == \
        storage.get_trial(killed).number
    assert points == [0, 1, 2]
    assert claim_waiting(study, storage) is None


def sampled_sweep(tmp_path, n_trials: int):
    """A random-sampler sweep's spec and study on SQLite with a 1 s heartbeat and grace."""
    spec = load_spec(write_spec(tmp_path, "sampled", {"seed_everything": [0, 1, 2]},
                                sampler="random", n_trials=n_trials))
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat=1, grace=1)
    return spec, storage, make_study(spec, storage)


def test_a_sampled_sweep_waits_for_its_killed_trial_and_runs_its_retry(tmp_path, monkeypatch):
    """n_trials 2, one done and one whose worker was killed (still RUNNING, within the grace
    period): the rerun waits until it goes stale, then runs the retry queued in its place;
    the failed trial the retry replaces does not count towards n_trials."""
    spec, storage, study = sampled_sweep(tmp_path, n_trials=2)
    study.tell(study.ask(), 0.5)
    killed = study.ask()
    storage.record_heartbeat(killed._trial_id)
    ran = []

    def run_trial(study, trial, *args) -> None:
        ran.append(storage.get_trial(trial._trial_id))
        study.tell(trial, 0.7)

    monkeypatch.setattr(sweeps.worker, "run_trial", run_trial)
    assert work(spec, storage, tmp_path / "runs", "w0", poll=0.2) == 1
    assert [(t.number, t.system_attrs.get("failed_trial")) for t in ran] == [(2, 1)]
    assert ran[0].params == study.trials[1].params  # the killed run's point, resumed
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL,
                                                     TrialState.COMPLETE]


def test_a_sampled_worker_killed_before_its_first_beat_leaves_a_trial_that_goes_stale(
        tmp_path, monkeypatch):
    """A new sampled trial has its heartbeat before it is RUNNING: a worker killed before its
    heartbeat thread beats leaves a trial failed as stale and queued again, not one RUNNING
    for ever."""
    spec, storage, study = sampled_sweep(tmp_path, n_trials=1)

    def killed(*args) -> None:
        raise KeyboardInterrupt  # stands for the SIGKILL

    monkeypatch.setattr(sweeps.worker, "Heartbeat", lambda *args: nullcontext())
    monkeypatch.setattr(sweeps.worker, "run_trial", killed)
    with pytest.raises(KeyboardInterrupt):
        work(spec, storage, tmp_path / "runs", "w0", poll=0.2)
    time.sleep(2.5)
    fail_stale_trials(study)
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]


def test_main_gives_its_argv_to_the_workers_it_starts(tmp_path, monkeypatch):
    """``main(argv)`` called from Python starts its ``--workers`` - 1 workers on ``argv`` (less
    the storage options), not on the calling process's own ``sys.argv``."""
    import yaml
    from paths import config

    import sweeps.__main__ as cli
    import sweeps.worker

    spec = tmp_path / "argv.yaml"
    spec.write_text(yaml.safe_dump({
        "study": "argv", "configs": [config("p4.yaml")], "profile": "smoke", "size": "tiny",
        "grid": {"seed_everything": [0]}, "lr": [3.0e-3]}))
    started = []
    popen = cli.subprocess.Popen

    class Child:
        def wait(self) -> int:
            return 0

    def start(cmd, **kwargs):
        if cmd[:3] != [sys.executable, "-m", "sweeps"]:
            return popen(cmd, **kwargs)  # e.g. ctypes asking ldconfig
        started.append((cmd, kwargs["env"]))
        return Child()

    monkeypatch.setattr(cli.subprocess, "Popen", start)
    monkeypatch.setattr(sweeps.worker, "work", lambda *a, **k: 0)
    monkeypatch.setattr(cli.sys, "argv", ["pytest", "--not-a-sweep-option"])
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    argv = ["run", str(spec), "--workers", "3", "--threads", "1", "--storage", url]
    monkeypatch.delenv("ARBENCH_SWEEP_WORKER", raising=False)
    monkeypatch.delenv("ARBENCH_SWEEP_SPEC", raising=False)
    assert cli.main(argv) == 0
    assert [cmd[3:] for cmd, _ in started] == [["run", str(spec), "--workers", "3",
                                                "--threads", "1"]] * 2
    assert [cmd[1:3] for cmd, _ in started] == [["-m", "sweeps"]] * 2
    assert [env["ARBENCH_STORAGE"] for _, env in started] == [url] * 2
    assert [env["ARBENCH_SWEEP_WORKER"] for _, env in started] == ["w1", "w2"]
