"""The protocol's edge cases in the tables: exact ties, runs that failed or diverged, seeds
missing at the best lr, a widened lr that failed, and pruned runs' columns in runs.csv."""

from types import SimpleNamespace

import optuna
import yaml
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from test_sweeps import config, sweep

from sweeps.report.rows import rows
from sweeps.report.runs import run_rows
from sweeps.report.table import flags
from sweeps.spec import SweepSpec
from sweeps.trials import best_lr, by_point_and_lr, unresolved_failures
from sweeps.widen import widened_points

SPEC = SimpleNamespace(study="s", direction="maximize", metric="val/acc")


def trial(lr, seed, value=None, state=TrialState.COMPLETE, attrs=None, curve=None):
    params = {"p": 2, "model.lr": lr, "seed_everything": seed}
    dists = {"p": IntDistribution(2, 2), "model.lr": FloatDistribution(lr, lr),
             "seed_everything": IntDistribution(seed, seed)}
    return create_trial(state=state, params=params, distributions=dists,
                        value=value if state == TrialState.COMPLETE else None,
                        intermediate_values=curve or {},
                        user_attrs={"hparams": {"p": 2}, **(attrs or {})},
                        system_attrs={"fixed_params": params})


def test_an_exact_tie_picks_the_middle_lr_so_no_edge_is_flagged():
    trials = [trial(lr, s, 1.0) for lr in (3e-4, 1e-3, 3e-3) for s in (0, 1, 2)]
    (by_lr,) = by_point_and_lr(trials).values()
    assert best_lr(by_lr) == 1e-3
    (row,) = rows(SPEC, trials)
    assert row["best_lr"] == 1e-3 and not row["lr_at_edge"] and flags(row) == ""
    two = [t for t in trials if t.params["model.lr"] != 3e-4]  # of two, the lower one
    assert best_lr(next(iter(by_point_and_lr(two).values()))) == 1e-3


def test_a_seed_run_twice_counts_once_by_its_latest_completed_run():
    """Two finished runs of one seed at one lr (a rerun, a worker thought dead that finished):
    the lr's mean and n count the seed once, by its latest completed run."""
    trials = [trial(1e-3, s, 0.9) for s in (0, 1, 2)]
    again = trial(1e-3, 0, 0.6)
    pruned = trial(1e-3, 1, state=TrialState.PRUNED, curve={250: 0.1})
    for number, t in enumerate([*trials, again, pruned]):
        t.number = number
    (row,) = rows(SPEC, [*trials, again, pruned])
    assert row["n"] == 3 and row["seed_values"] == {0: 0.6, 1: 0.9, 2: 0.9}
    assert row["mean"] == sum((0.6, 0.9, 0.9)) / 3
    (by_lr,) = by_point_and_lr([*trials, again, pruned]).values()
    assert [t.number for t in by_lr[1e-3]] == [1, 2, 3]


def test_a_failed_run_is_flagged_and_so_are_missing_seeds():
    """lr 3e-3 lost seed 0 to a failure: its mean over the two others (0.95) wins, and the
    row says so instead of reading as a 3-seed mean."""
    trials = [trial(1e-3, s, 0.9) for s in (0, 1, 2)]
    trials += [trial(3e-3, 0, state=TrialState.FAIL), trial(3e-3, 1, 0.95),
               trial(3e-3, 2, 0.95)]
    assert [t.params["seed_everything"] for t in unresolved_failures(trials)] == [0]
    (row,) = rows(SPEC, trials)
    assert (row["best_lr"], row["n"], row["failed"], row["seeds"]) == (3e-3, 2, 1, 3)
    assert flags(row) == "2 of 3 seeds; 1 failed (left out); best lr at grid edge"
    retried = trials + [trial(3e-3, 0, 0.2)]  # a retry gives the run its result
    assert unresolved_failures(retried) == []
    (row,) = rows(SPEC, retried)
    assert (row["best_lr"], row["n"], row["failed"]) == (1e-3, 3, 0)
    assert flags(row) == "best lr at grid edge"


def test_a_diverged_run_counts_at_its_best_before_it_and_is_flagged():
    trials = [trial(1e-3, s, 0.9) for s in (0, 1, 2)]
    trials += [trial(3e-3, 0, 0.3, attrs={"diverged": "DivergenceError: diverged at step 700"}),
               trial(3e-3, 1, 0.95), trial(3e-3, 2, 0.95)]
    (row,) = rows(SPEC, trials)
    assert row["best_lr"] == 1e-3 and row["lr_means"][3e-3] == (0.3 + 0.95 * 2) / 3
    at_edge = [t for t in trials if t.params["model.lr"] == 3e-3]
    (row,) = rows(SPEC, at_edge)
    assert row["diverged"] == 1 and "1 diverged" in flags(row)
    (runs,) = [r for r in run_rows(SPEC, trials) if r["diverged"]]
    assert runs["seed"] == 0 and runs["val_acc"] is None  # no val_acc recorded in this double


def test_a_widened_lr_that_failed_is_not_queued_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for t in [trial(1e-3, s, 0.9) for s in (0, 1)] + [trial(3e-3, s, 0.95) for s in (0, 1)]:
        study.add_trial(t)
    spec = SweepSpec(path=tmp_path / "s.yaml", study="s", configs=[], profile="smoke",
                     grid={"p": [2], "seed": [0, 1]}, lr=[1e-3, 3e-3])
    assert {p["model.lr"] for p in widened_points(study, spec, 2)} == {9e-3}
    for s in (0, 1):
        study.add_trial(trial(9e-3, s, state=TrialState.FAIL))
    assert widened_points(study, spec, 2) == []


def test_a_pruned_run_fills_its_objectives_columns_only():
    """Judged by zoology's metric, a pruned run's best and last intermediate values are
    example accuracies: they go to example_acc, never to the val_acc column."""
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/example_acc")
    done = trial(1e-3, 0, 0.7, attrs={"val_acc": 0.95, "example_acc": 0.7})
    pruned = trial(1e-3, 1, state=TrialState.PRUNED, curve={500: 0.4, 1000: 0.3})
    pruned_row = run_rows(spec, [done, pruned])[1]
    assert pruned_row["val_acc"] is None and pruned_row["last_val_acc"] is None
    assert (pruned_row["example_acc"], pruned_row["last_example_acc"]) == (0.4, 0.3)


def test_a_run_that_diverges_after_a_validation_completes_at_its_best_before_it(tmp_path):
    """LLoPS p=2 at lr 100 (smoke size, warm-up over all 20 steps, a validation every 2) turns
    its loss non-finite at step 10: the sweep records the run as finished, valued at its best
    validation before, flagged ``diverged``; the sweep itself succeeds."""
    path = tmp_path / "div.yaml"
    path.write_text(yaml.safe_dump({
        "study": "div", "configs": [config("p2.yaml")], "profile": "smoke", "size": "tiny",
        "grid": {"seed": [0]}, "lr": [100.0],
        "args": ["--model.warmup_steps", "20", "--trainer.val_check_interval", "2"]}))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(path), "--storage", url, "--runs", str(tmp_path / "runs"),
                cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "diverged (DivergenceError: diverged at step 10" in out.stdout
    (t,) = optuna.load_study(study_name="div", storage=url).get_trials()
    assert t.state == TrialState.COMPLETE and t.value == t.user_attrs["val_acc"]
    assert t.user_attrs["diverged"].startswith("DivergenceError: diverged at step 10")
    assert t.user_attrs["global_step"] == 10  # where it stopped


def test_convergence_and_slices_are_judged_in_the_objectives_metric():
    """A study judged by zoology's metric: its rows' verdict comes from each run's curve of
    that metric and its slice columns from that metric's slices (the run's own ``converged``
    and ``slices`` are val/acc's); a run that diverged has not converged."""
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/example_acc")
    flat = [[250, 0.80], [500, 0.89], [750, 0.893], [1000, 0.895]]  # zoology's: settled
    rising = [[250, 0.50], [500, 0.60], [750, 0.70], [1000, 0.73]]  # val/acc: still rising
    attrs = {"converged": False, "val_curve": rising, "example_curve": flat,
             "slices": {"L64_N4": 0.17}, "example_slices": {"L64_N4": 0.555}}
    (row,) = rows(spec, [trial(1e-3, s, 0.9, attrs=attrs) for s in (0, 1)])
    assert (row["converged"], row["not_converged"]) == (1.0, 0)
    assert row["slices"] == {"L64_N4": 0.555}
    (row,) = rows(SPEC, [trial(1e-3, s, 0.9, attrs=attrs) for s in (0, 1)])  # val/acc's
    assert (row["converged"], row["slices"]) == (0.0, {"L64_N4": 0.17})
    cut = {**attrs, "diverged": "DivergenceError: diverged at step 1100"}
    (row,) = rows(spec, [trial(1e-3, 0, 0.9, attrs=attrs), trial(1e-3, 1, 0.9, attrs=cut)])
    assert row["not_converged"] == 1 and "1 of 2 not converged" in flags(row)


def test_the_not_converged_flag_counts_the_runs_with_a_verdict():
    pruned = trial(1e-3, 2, state=TrialState.PRUNED, curve={250: 0.5})
    (row,) = rows(SPEC, [trial(1e-3, s, 0.9, attrs={"converged": False}) for s in (0, 1)]
                  + [pruned])
    assert row["n"] == 3 and "2 of 2 not converged" in flags(row)


def test_a_run_the_profile_stopped_on_val_acc_has_converged_in_zoologys_metric_too():
    """The profiles stop at val/acc 0.99: a run stopped there has no last quarter in which
    zoology's metric could settle, and is converged in a study judged by it, as in runs.csv."""
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/example_acc")
    stopped = {"converged": True, "val_curve": [[250, 0.90], [500, 0.992]],
               "example_curve": [[250, 0.70], [500, 0.925]]}
    rising = {**stopped, "val_curve": [[250, 0.90], [500, 0.95]], "converged": False}
    (row,) = rows(spec, [trial(1e-3, 0, 0.925, attrs=stopped), trial(1e-3, 1, 0.9, attrs=rising)])
    assert row["not_converged"] == 1 and "1 of 2 not converged" in flags(row)
    assert [r["converged"] for r in run_rows(spec, [trial(1e-3, 0, 0.925, attrs=stopped),
                                                    trial(1e-3, 1, 0.9, attrs=rising)])] == \
        [True, False]
