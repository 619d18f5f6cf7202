"""The lr sub-grid widens at an edge (issue 13's protocol): which points, which lrs."""

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from test_sweeps import sweep, write_spec

from sweeps.spec import load_spec
from sweeps.widen import next_lr, widened_points

LRS = [3.0e-4, 1.0e-3, 3.0e-3]


def add(study, p, lr, seed, value, state=TrialState.COMPLETE):
    params = {"model.feature_map.init_args.p": p, "model.lr": lr, "seed_everything": seed}
    dists = {k: CategoricalDistribution([v]) for k, v in params.items()}
    study.add_trial(create_trial(state=state, params=params, distributions=dists,
                                 value=value if state == TrialState.COMPLETE else None))


@pytest.fixture
def spec(tmp_path):
    path = write_spec(tmp_path, "w", {"model.feature_map.init_args.p": [2, 4, 6],
                                      "seed_everything": [0, 1]}, lr=LRS)
    return load_spec(path, "smoke")


def test_next_lr_is_one_geometric_step_beyond_the_edge():
    assert next_lr(LRS, low=True) == 9e-5
    assert next_lr(LRS, low=False) == 9e-3


def test_only_finished_points_at_an_edge_are_widened(spec):
    study = optuna.create_study(direction="maximize")
    accs = {2: [0.9, 0.8, 0.7],   # best at the lowest lr: widen below
            4: [0.7, 0.9, 0.8],   # best inside: nothing
            6: [0.6, 0.7, 0.8]}   # best at the highest lr, but a run is still waiting
    for p, values in accs.items():
        for lr, v in zip(LRS, values):
            for seed in (0, 1):
                add(study, p, lr, seed, v + 0.01 * seed)
    add(study, 6, 1e-2, 0, None, state=TrialState.WAITING)
    queued = widened_points(study, spec, max_added=2)
    assert sorted((q["model.feature_map.init_args.p"], q["model.lr"], q["seed_everything"])
                  for q in queued) == [(2, 9e-5, 0), (2, 9e-5, 1)]


def test_widening_stops_after_max_added_lrs(spec):
    study = optuna.create_study(direction="maximize")
    for lr, v in zip([9e-5, *LRS], [0.95, 0.9, 0.8, 0.7]):
        add(study, 2, lr, 0, v)
    assert [q["model.lr"] for q in widened_points(study, spec, max_added=2)] == [2.7e-5]
    assert widened_points(study, spec, max_added=1) == []


def test_sweep_run_widen_queues_and_runs_the_edge_lr(tmp_path):
    spec = write_spec(tmp_path, "widen", {"seed_everything": [0]}, lr=[1.0e-3, 3.0e-3])
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(spec), "--storage", url, "--widen", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "widening: 1 run(s) at lr" in out.stdout
    trials = optuna.load_study(study_name="widen", storage=url).get_trials()
    lrs = sorted(t.params["model.lr"] for t in trials if t.state == TrialState.COMPLETE)
    assert len(lrs) in (3, 4) and set(lrs) - {1e-3, 3e-3} <= {3.33e-4, 9e-3}


def test_widen_with_a_second_spec_that_sets_its_own_lrs_runs_both_workers(tmp_path):
    # the second worker of each spec loads only that spec; --widen must not reject it there
    first = write_spec(tmp_path, "edge", {"seed_everything": [0]}, lr=[1.0e-3, 3.0e-3])
    second = write_spec(tmp_path, "fixed", {"seed_everything": [0, 1]}, lr=[3.0e-3])
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(first), str(second), "--storage", url, "--widen", "1",
                "--workers", "2", "--threads", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "error" not in out.stderr
    assert "fixed: no lr sub-grid" in out.stdout
    trials = optuna.load_study(study_name="fixed", storage=url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2


def test_an_inner_lr_that_failed_neither_makes_an_edge_nor_widens_the_step(spec):
    study = optuna.create_study(direction="maximize")
    # p=2: its lowest lr failed at every seed; the best, 1e-3, is inside the lrs tried
    for seed in (0, 1):
        add(study, 2, 3e-4, seed, None, state=TrialState.FAIL)
        add(study, 2, 1e-3, seed, 0.9)
        add(study, 2, 3e-3, seed, 0.8)
    assert widened_points(study, spec, max_added=2) == []
    # p=4: its middle lr failed; the best is the lowest, widened one grid step (not two) below
    for seed in (0, 1):
        add(study, 4, 3e-4, seed, 0.9)
        add(study, 4, 1e-3, seed, None, state=TrialState.FAIL)
        add(study, 4, 3e-3, seed, 0.8)
    assert [q["model.lr"] for q in widened_points(study, spec, max_added=2)] == [9e-5, 9e-5]
