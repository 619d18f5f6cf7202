import sqlite3
import threading
import time

import optuna
import pytest
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from sweeps.storage import StorageError, open_storage, schema_race


def test_sqlite_claim_has_one_winner_when_two_workers_read_at_once(tmp_path, monkeypatch):
    """Two workers (two engines on one file) claim the same WAITING trial; the read is held
    open for 0.5 s so both reads overlap unless the transaction locks from its start."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storages = [open_storage(url), open_storage(url)]
    study = optuna.create_study(study_name="claim", storage=storages[0])
    study.enqueue_trial({"x": 1})
    trial_id = study.get_trials(deepcopy=False)[0]._trial_id

    check = RDBStorage.check_trial_is_updatable

    def slow_check(self, tid, state):
        time.sleep(0.5)  # between the read of the trial's state and the write of RUNNING
        return check(self, tid, state)

    monkeypatch.setattr(RDBStorage, "check_trial_is_updatable", slow_check)
    won: list[bool] = []
    threads = [threading.Thread(target=lambda s=s: won.append(
        s.set_trial_state_values(trial_id, TrialState.RUNNING))) for s in storages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False, True]
    assert storages[1].get_trial(trial_id).state == TrialState.RUNNING


def test_a_locked_sqlite_file_fails_after_about_the_lock_timeout(tmp_path):
    """Another process holding the write lock is no schema-creation race: opening stops after
    about ``--lock-timeout`` (0.5 s here), not after six timeouts and the retries' pauses
    between them (over 10 s)."""
    path = tmp_path / "db.sqlite"
    open_storage(f"sqlite:///{path}").engine.dispose()  # the schema exists
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with pytest.raises(StorageError, match="locked by another process for longer than "
                                               "--lock-timeout"):
            open_storage(f"sqlite:///{path}", lock_timeout=0.5)
        elapsed = time.monotonic() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert 0.5 <= elapsed < 3.0, elapsed
    assert schema_race("database is locked", 0.01, 0.5)  # a deadlock answers at once: retried
    assert schema_race("table studies already exists", 30.0, 0.5)
    assert not schema_race("no such table: studies", 0.01, 0.5)
