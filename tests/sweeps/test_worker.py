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
