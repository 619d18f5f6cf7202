import time

import optuna
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState

from sweeps.storage import open_storage
from sweeps.worker import claim_waiting


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
