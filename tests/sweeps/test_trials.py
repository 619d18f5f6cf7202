"""Reading a study's objective and its runs' values (sweeps.trials)."""

from types import SimpleNamespace

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.report import study_trials
from sweeps.trials import counted_runs, objective_curve, study_metric, valued_by


def run(value, val_acc, example_acc, reused_from=None, seed=0):
    attrs = {"val_acc": val_acc, "example_acc": example_acc,
             "slices": {"L64_N4": val_acc}, "example_slices": {"L64_N4": example_acc}}
    if reused_from:
        attrs["reused_from"] = reused_from
    return create_trial(state=TrialState.COMPLETE, value=value, params={"seed_everything": seed},
                        distributions={"seed_everything": IntDistribution(0, 9)},
                        user_attrs=attrs)


def test_study_metric_is_the_recorded_one_else_the_one_its_trained_runs_match():
    assert study_metric({"metric": "val/example_acc"}, []) == "val/example_acc"
    by_acc = [run(0.5, 0.5, 0.8), run(0.6, 0.6, 0.9, seed=1)]
    assert study_metric({}, by_acc) == "val/acc"
    by_example = [run(0.8, 0.5, 0.8), run(0.7, 0.6, 0.7, reused_from="x#0")]
    assert study_metric({}, by_example) == "val/example_acc"  # the reused run does not count
    assert study_metric({}, [run(1.0, 1.0, 1.0)]) is None  # both metrics match: unknown
    assert study_metric({}, [run(0.3, 0.5, 0.8)]) is None
    assert study_metric({}, []) is None


def test_valued_by_revalues_reused_runs_only():
    """A run reused before reuse valued runs by the reusing study's objective holds its source
    study's val/acc; the report reads it by the study's metric. Trained runs keep their value."""
    old = run(0.80, 0.80, 0.936, reused_from="calibration_long_6k#1")
    trained = run(0.889, 0.687, 0.889, seed=1)
    pruned = create_trial(state=TrialState.PRUNED, params={}, distributions={},
                          intermediate_values={3: 0.4}, user_attrs={"reused_from": "x#1",
                                                                    "example_acc": 0.9})
    fixed, kept, still_pruned = valued_by([old, trained, pruned], "val/example_acc")
    assert fixed.value == 0.936 and old.value == 0.80  # a copy: the loaded trial is unchanged
    assert kept is trained and still_pruned is pruned
    (per_slice,) = valued_by([old], "val/acc_L64_N4")
    assert per_slice.value == 0.80
    assert valued_by([run(0.5, 0.5, 0.8, reused_from="y#0")], "val/acc")[0].value == 0.5


def test_the_report_reads_reused_runs_by_the_specs_objective(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.add_trial(run(0.80, 0.80, 0.936, reused_from="calibration_long_6k#1"))
    spec = SimpleNamespace(study="s", metric="val/example_acc")
    assert [t.value for t in study_trials(spec, url)] == [0.936]


def test_objective_curve_is_the_studys_metric():
    t = run(0.9, 0.6, 0.9)
    t.user_attrs.update(val_curve=[[500, 0.3], [1000, 0.6]],
                        example_curve=[[500, 0.5], [1000, 0.9]])
    assert objective_curve(t, "val/acc") == [(500, 0.3), (1000, 0.6)]
    assert objective_curve(t, "val/example_acc") == [(500, 0.5), (1000, 0.9)]
    assert objective_curve(t, "val/acc_L64_N4") == []  # no whole curve of one slice is kept
    del t.user_attrs["example_curve"]
    assert objective_curve(t, "val/example_acc") == []
    live = create_trial(state=TrialState.PRUNED, params={}, distributions={},
                        intermediate_values={1000: 0.4, 500: 0.2},
                        user_attrs={"val_curve": [[500, 0.1]]})
    assert objective_curve(live, "val/example_acc") == [(500, 0.2), (1000, 0.4)]


def test_a_killed_run_and_its_retries_count_once_towards_n_trials():
    """A sampled sweep's count: a failed trial a later one retries (Optuna's stale retry names
    the chain's first in ``failed_trial``, every one in ``retry_history``) is not counted; a
    failure nothing retries, and names that are not trial numbers, are left as they are."""
    def trial(number, state, **attrs):
        t = create_trial(state=state, value=0.5 if state == TrialState.COMPLETE else None,
                         system_attrs=attrs)
        t.number = number
        return t

    chain = [trial(0, TrialState.COMPLETE),
             trial(1, TrialState.FAIL),  # killed
             trial(2, TrialState.FAIL, failed_trial=1, retry_history=[1]),  # killed again
             trial(3, TrialState.WAITING, failed_trial=1, retry_history=[1, 2]),
             trial(4, TrialState.FAIL),  # raised: not retried
             trial(5, TrialState.RUNNING, failed_trial=True, retry_history="4")]
    assert [t.number for t in counted_runs(chain)] == [0, 3, 4, 5]
