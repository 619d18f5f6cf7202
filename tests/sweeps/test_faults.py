"""The database goes away mid-sweep (``sweeps.faults``): a PostgreSQL restart, SQLite locked
longer than ``--lock-timeout``. Every process stops with one line and status 3; the same
command, rerun, records every grid point exactly once and retrains no finished run."""

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from test_sweeps import GRID4, completed_points, sweep, write_spec

from sweeps.faults import STORAGE_LOST_STATUS, storage_fault, storage_lost_message

PG_URL = os.environ.get("ARBENCH_TEST_PG_URL")
STEPS = ["--trainer.max_steps=30", "--trainer.val_check_interval=10"]


def pg_datadir() -> str | None:
    """The data folder of the test server (``.ci/postgres.sh`` notes it), or None."""
    given = os.environ.get("ARBENCH_TEST_PG_DATADIR")
    note = Path("/tmp/arbench-pg.datadir")
    return given or (note.read_text().strip() if note.is_file() else None)


def pg_ctl(action: str) -> None:
    """``pg_ctl stop`` or ``start`` the test server, as its owner when run as root."""
    datadir = pg_datadir()
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                  key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()])
    port = PG_URL.rsplit(":", 1)[1].split("/")[0]
    extra = f"-o '-k {datadir} -p {port} -h 127.0.0.1' -l {datadir}/log" if action == "start" \
        else "-m fast"
    command = f"{bins[-1]} -D {datadir} {extra} -w {action}"
    if os.geteuid() == 0:
        command = f"su postgres -s /bin/sh -c \"{command}\""
    subprocess.run(command, shell=True, check=True, capture_output=True, timeout=120)


def wait_for_completed(study: str, url: str, proc: subprocess.Popen, n: int = 1,
                       timeout: float = 300) -> list[optuna.trial.FrozenTrial]:
    """Poll until ``n`` trials of ``study`` are complete (the sweep still running)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            done = [t for t in optuna.load_study(study_name=study, storage=url).get_trials()
                    if t.state == optuna.trial.TrialState.COMPLETE]
        except KeyError:
            done = []
        if len(done) >= n:
            return done
        time.sleep(0.5)
    raise AssertionError(f"no {n} trial(s) of {study} completed while the sweep ran")


def assert_stopped_in_one_line_each(proc: subprocess.Popen, needle: str, processes: int) -> None:
    """The sweep (parent and workers: ``processes``) exited with status 3, each process
    printing at most one ``error:`` line that says what went away, and no traceback."""
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == STORAGE_LOST_STATUS, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert 1 <= len(lines) <= processes, err[-3000:]
    assert all(needle in line for line in lines), err[-3000:]
    assert all("rerun the same command" in line for line in lines)


def assert_resumed_exactly_once(study: str, url: str, before: list, points: int) -> None:
    counts = completed_points(study, url)
    assert len(counts) == points and set(counts.values()) == {1}, counts
    after = {t.number: t for t in optuna.load_study(study_name=study, storage=url).get_trials()}
    for trial in before:  # finished before the fault: never rerun
        assert after[trial.number].state == optuna.trial.TrialState.COMPLETE
        assert after[trial.number].datetime_complete == trial.datetime_complete


@pytest.mark.skipif(not PG_URL or not pg_datadir(),
                    reason="no PostgreSQL server to restart (set ARBENCH_TEST_PG_URL and "
                           "ARBENCH_TEST_PG_DATADIR; .ci/run does)")
def test_a_postgresql_restart_mid_sweep_loses_no_trial(tmp_path):
    study = f"restart{int(time.time() * 1000)}"
    spec = write_spec(tmp_path, study, GRID4, args=STEPS)
    cmd = [sys.executable, "-m", "sweeps", "run", str(spec), "--workers", "2", "--threads",
           "1", "--heartbeat", "1", "--grace", "3"]
    env = {**os.environ, "ARBENCH_STORAGE": PG_URL}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        before = wait_for_completed(study, PG_URL, proc)
        pg_ctl("stop")
        assert_stopped_in_one_line_each(proc, "the storage went away", 2)
    finally:
        if proc.poll() is None:
            proc.kill()
        pg_ctl("start")
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_resumed_exactly_once(study, PG_URL, before, points=4)


def test_sqlite_locked_past_the_timeout_under_more_workers_than_cores(tmp_path):
    """Three workers on a machine of fewer cores; another process holds the database's write
    lock for longer than ``--lock-timeout``."""
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    spec = write_spec(tmp_path, "locked", {**GRID4, "model.d_model": [32, 64]}, args=STEPS)
    workers = str(max(3, (os.cpu_count() or 1) + 1))
    cmd = [sys.executable, "-m", "sweeps", "run", str(spec), "--storage", url, "--workers",
           workers, "--threads", "1", "--heartbeat", "1", "--grace", "3", "--lock-timeout", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    holder = sqlite3.connect(db, timeout=60, isolation_level=None)
    try:
        before = wait_for_completed("locked", url, proc)
        holder.execute("BEGIN EXCLUSIVE")  # as a stuck process would
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        holder.execute("ROLLBACK")
        assert_stopped_in_one_line_each(proc, "stayed locked by another process", int(workers))
    finally:
        holder.close()
        if proc.poll() is None:
            proc.kill()
    # the rerun's workers only wait on each other: a lock timeout they meet on a loaded machine
    again = sweep(*cmd[3:-1], "30", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_resumed_exactly_once("locked", url, before, points=8)


def test_a_storage_fault_is_found_in_the_chain_and_told_in_one_line():
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import OperationalError

    class DriverError(Exception):
        pass

    gone = OperationalError("SELECT 1", {}, DriverError("connection refused\nDETAIL: more"))
    try:
        try:
            raise gone
        except OperationalError as err:
            raise StorageInternalError("An exception is raised during the commit.") from err
    except StorageInternalError as wrapped:
        assert storage_fault(wrapped) is gone
    assert storage_fault(ValueError("a trial's own error")) is None
    line = storage_lost_message(gone, "w1")
    assert line.startswith("worker w1: the storage went away (connection refused); finished")
    assert "\n" not in line
    locked = OperationalError("BEGIN", {}, DriverError("database is locked"))
    assert "stayed locked by another process" in storage_lost_message(locked)


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_lock_timeout_must_be_a_positive_number(tmp_path, value):
    out = sweep("status", "--lock-timeout", value, cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: --lock-timeout must be a positive number of seconds, got {float(value)}"]
