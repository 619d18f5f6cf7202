"""A retried trial is judged by the pruner on its own run: it inherits no rung values, and a
resumed run's curve up to its checkpoint is replayed against the bracket."""

import time

import optuna
import pytest
import torch
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState

from sweeps.pruning import BracketPruner
from sweeps.queue import requeue
from sweeps.retry import checkpoint_progress, replaced_curve, replaced_trials, replay_curve
from sweeps.storage import open_storage
from sweeps.worker import claim_waiting

DISTS = {"model.lr": FloatDistribution(1e-4, 1e-2), "seed_everything": IntDistribution(0, 9)}


def halving_study(tmp_path, heartbeat: int = 30, grace: int = 120):
    """A study on SQLite whose pruner halves the lr sub-grid {3e-4, 1e-3, 3e-3} at step 100."""
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat=heartbeat,
                           grace=grace)
    pruner = BracketPruner(optuna.pruners.SuccessiveHalvingPruner(min_resource=100,
                                                                  reduction_factor=3),
                           grid_lrs=[3e-4, 1e-3, 3e-3])
    study = optuna.create_study(study_name="retry", storage=storage, direction="maximize",
                                pruner=pruner)
    return study, storage


def start(study, storage, lr: float) -> optuna.Trial:
    study.enqueue_trial({"model.lr": lr, "seed_everything": 0})
    trial = optuna.Trial(study, claim_waiting(study, storage))
    for key, dist in DISTS.items():
        trial._suggest(key, dist)
    return trial


def finish_two_good_runs(study, storage) -> None:
    """The bracket's 3e-4 and 1e-3 runs pass step 100 at 0.5 and 0.6 and finish at 0.9."""
    for lr, value in ((3e-4, 0.5), (1e-3, 0.6)):
        run = start(study, storage, lr)
        run.report(value, 100)
        assert not run.should_prune()
        study.tell(run, 0.9)


def rungs(trial) -> dict:
    return {k: v for k, v in trial.system_attrs.items() if k.startswith("completed_rung_")}


def test_a_stale_trials_retry_inherits_no_rung_values(tmp_path):
    study, storage = halving_study(tmp_path, heartbeat=1, grace=1)
    run = start(study, storage, 3e-3)
    run.report(0.9, 100)
    assert not run.should_prune()  # alone in its bracket: it passes rung 0 at 0.9
    assert rungs(storage.get_trial(run._trial_id)) == {"completed_rung_0": 0.9}
    time.sleep(2.5)  # its worker died
    fail_stale_trials(study)
    retry = study.get_trials(states=(TrialState.WAITING,))[0]
    assert retry.system_attrs["failed_trial"] == run.number
    assert rungs(retry) == {}
    assert retry.system_attrs["fixed_params"] == {"model.lr": 3e-3, "seed_everything": 0}


def failed_run(study, storage, values: dict[int, float]) -> optuna.Trial:
    """A 3e-3 run that reports ``values`` (step -> val), asking the pruner after each (so it
    records the rungs it passes), then fails."""
    run = start(study, storage, 3e-3)
    for step, value in values.items():
        run.report(value, step)
        run.should_prune()
    study.tell(run, state=TrialState.FAIL)
    return run


def test_a_failed_trial_queued_again_inherits_no_rung_values(tmp_path):
    study, storage = halving_study(tmp_path)
    run = failed_run(study, storage, {100: 0.9})
    requeue(study, study.get_trials()[0])
    retry = study.get_trials(states=(TrialState.WAITING,))[0]
    assert retry.system_attrs["failed_trial"] == run.number and rungs(retry) == {}


def killed_run_and_its_retry(study, storage, values: dict[int, float]) -> optuna.Trial:
    """A :func:`failed_run` with ``values``, and its retry, claimed."""
    run = failed_run(study, storage, values)
    requeue(study, study.get_trials(states=(TrialState.FAIL,))[0])
    retry = optuna.Trial(study, claim_waiting(study, storage))
    assert storage.get_trial(retry._trial_id).system_attrs["failed_trial"] == run.number
    return retry


def test_a_resumed_retry_meets_the_rung_it_had_passed_with_its_own_value(tmp_path):
    # the killed run stood alone in its bracket at step 100 (0.1 passed then); by now the
    # bracket's other lrs have passed at 0.5 and 0.6, and the replayed 0.1 does not
    study, storage = halving_study(tmp_path)
    retry = killed_run_and_its_retry(study, storage, {50: 0.05, 100: 0.1, 150: 0.2})
    finish_two_good_runs(study, storage)
    with pytest.raises(optuna.TrialPruned, match="step 100"):
        replay_curve(retry, up_to_step=150)
    frozen = storage.get_trial(retry._trial_id)
    assert frozen.intermediate_values == {50: 0.05, 100: 0.1}
    assert rungs(frozen) == {"completed_rung_0": 0.1}


def test_a_resumed_retry_that_still_passes_goes_on_with_the_curve_up_to_its_checkpoint(
        tmp_path):
    study, storage = halving_study(tmp_path)
    retry = killed_run_and_its_retry(study, storage, {100: 0.7, 200: 0.8, 300: 0.85})
    finish_two_good_runs(study, storage)
    replay_curve(retry, up_to_step=200)  # the checkpoint is at 200; 300 was after it
    frozen = storage.get_trial(retry._trial_id)
    assert frozen.intermediate_values == {100: 0.7, 200: 0.8}
    assert rungs(frozen) == {"completed_rung_0": 0.7}


def test_a_retry_training_from_step_0_holds_no_rung_until_it_reaches_one(tmp_path):
    study, storage = halving_study(tmp_path)
    retry = killed_run_and_its_retry(study, storage, {100: 0.9})
    replay_curve(retry, up_to_step=0)
    assert storage.get_trial(retry._trial_id).intermediate_values == {}
    finish_two_good_runs(study, storage)
    retry.report(0.1, 100)  # its own value at the rung, not the failed run's 0.9
    assert retry.should_prune()


def test_a_failed_trials_rung_value_does_not_compete(tmp_path):
    # a failed 3e-3 run passed step 100 at 0.95; its retry stands for it, so the bracket's
    # 3e-4 run is judged against the runs that are results (alone: it passes)
    study, storage = halving_study(tmp_path)
    failed_run(study, storage, {100: 0.95})
    run = start(study, storage, 3e-4)
    run.report(0.2, 100)
    assert not run.should_prune()


def test_checkpoint_progress_reads_the_global_step_and_the_run_summarys_wall_time(tmp_path):
    weights = {"w": torch.zeros(2)}
    torch.save({"global_step": 1250, "state_dict": weights,
                "callbacks": {"RunSummary": {"wall_time_s": 412.5}}}, tmp_path / "a.ckpt")
    torch.save({"global_step": 5, "state_dict": weights}, tmp_path / "b.ckpt")
    assert checkpoint_progress(tmp_path / "a.ckpt") == (1250, 412.5)
    assert checkpoint_progress(tmp_path / "b.ckpt") == (5, 0.0)


def test_a_retry_of_retries_replays_the_curve_of_every_run_before_it(tmp_path):
    # killed twice (Optuna's stale retries), then failed by raising and queued again
    study, storage = halving_study(tmp_path, heartbeat=1, grace=1)
    first = start(study, storage, 3e-3)
    first.report(0.7, 100)
    for step in (200, 300):
        time.sleep(2.5)
        fail_stale_trials(study)
        run = optuna.Trial(study, claim_waiting(study, storage))
        run.report(step / 400, step)
    study.tell(run, state=TrialState.FAIL)
    requeue(study, study.get_trials(states=(TrialState.FAIL,))[-1])
    last = study.get_trials(states=(TrialState.WAITING,))[0]
    assert [t.number for t in replaced_trials(study, last)] == [0, 1, 2]
    assert replaced_curve(study, last) == {100: 0.7, 200: 0.5, 300: 0.75}
