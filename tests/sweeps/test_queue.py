"""The queueing lock (sweeps.queue): stamped with its holder, taken over once past its
timeout by one start of several, and never deleted by a start that no longer holds it."""

import functools
import multiprocessing
import os
import socket
import time

import optuna
from optuna.trial import TrialState
from test_sweeps import GRID4, write_spec

from sweeps import queue
from sweeps.queue import enqueue_grid, queue_lock
from sweeps.spec import load_spec
from sweeps.storage import open_storage
from sweeps.study import make_study
from sweeps.trials import lock_study_name

LOCK = lock_study_name("s")


def lock_holder(storage) -> dict | None:
    """The stamp of the lock study of ``s`` (None: no lock there)."""
    if LOCK not in optuna.get_all_study_names(storage):
        return None
    return optuna.load_study(study_name=LOCK, storage=storage).user_attrs.get("holder", {})


def test_a_lock_without_a_stamp_is_taken_over_after_the_timeout_and_says_so(tmp_path,
                                                                            capsys):
    """A lock left by a start from before stamps is timed from when this start first saw it;
    the wait and the takeover each say so in one line, and the lock is gone afterwards."""
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    optuna.create_study(study_name=LOCK, storage=storage)
    t0 = time.time()
    with queue_lock(storage, "s", timeout=1.0):
        waited = time.time() - t0
        holder = lock_holder(storage)
    assert 1.0 <= waited < 10
    assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    assert t0 < holder["since"] <= time.time()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "waiting for the queueing lock of study s",
        "took over the queueing lock of study s from a start that left no stamp"]
    assert lock_holder(storage) is None


def test_a_start_whose_lock_was_taken_over_leaves_the_new_holders_lock(tmp_path, capsys):
    """A holder that stalls past the timeout loses the lock to the next start; on its exit it
    deletes nothing (the lock is the new holder's), and says so."""
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    stalled, taker = queue_lock(storage, "s", timeout=0.3), queue_lock(storage, "s", timeout=0.3)
    stalled.__enter__()
    first = lock_holder(storage)
    time.sleep(0.5)
    taker.__enter__()  # no wait: the stamp says the lock is 0.5 s old
    second = lock_holder(storage)
    assert second["token"] != first["token"]
    stalled.__exit__(None, None, None)
    assert lock_holder(storage) == second
    taker.__exit__(None, None, None)
    assert lock_holder(storage) is None
    out = capsys.readouterr().out
    assert "took over the queueing lock of study s from pid" in out
    assert "the queueing lock of study s was taken over by pid" in out
    assert "waiting" not in out


def start(url: str, spec_path: str) -> tuple[int, int]:
    """One ``sweeps run`` start's queueing, in a process of its own."""
    spec = load_spec(spec_path)
    storage = open_storage(url)
    return enqueue_grid(make_study(spec, storage), spec, storage)


def test_two_starts_after_a_killed_one_take_its_lock_over_once(tmp_path, monkeypatch, capfd):
    """A lock left an hour ago by a start killed while queueing: two starts at once find it
    stale; one takes it over and queues the grid, the other waits for that one and queues
    nothing (every point once)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec_path = write_spec(tmp_path, "s", GRID4)
    storage = open_storage(url)
    make_study(load_spec(spec_path), storage)
    dead = optuna.create_study(study_name=LOCK, storage=storage)
    dead.set_user_attr("holder", {"pid": 1, "host": "gone", "since": time.time() - 3600,
                                  "token": "dead"})
    reuse_points = queue.reuse_points

    def reuse_slowly(*args):  # a database across the network: queueing takes a while
        time.sleep(0.5)
        return reuse_points(*args)

    monkeypatch.setattr(queue, "reuse_points", reuse_slowly)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        queued = pool.starmap_async(functools.partial(start, url),
                                    [(str(spec_path),)] * 2).get(timeout=100)
    assert sorted(queued) == [(0, 0), (4, 0)]
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    assert [t.state for t in trials] == [TrialState.WAITING] * 4
    assert lock_holder(storage) is None
    out = capfd.readouterr().out
    assert out.count("took over the queueing lock of study s from pid 1 on gone") == 1
