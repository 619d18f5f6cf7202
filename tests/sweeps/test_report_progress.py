"""A point still running is reported as provisional; failures count missing runs; runs.csv keeps
a per-slice objective out of the overall accuracy's columns; one seed shows no spread."""

import csv
import itertools
from types import SimpleNamespace

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.report.rows import rows
from sweeps.report.runs import run_rows
from sweeps.report.suite import claim_text
from sweeps.report.table import claim_rows, claims_text, flags, mean_std_text, write_table

LRS = (1e-4, 3e-4, 1e-3)
SEEDS = (0, 1, 2)
HP = {"hparams": {"feature_map": "LLoPS", "p": 2, "rank": 1}}


def trial(lr, seed, state=TrialState.COMPLETE, value=None, iv=None, ua=None):
    """A trial of point p=2 at ``lr`` and ``seed``, queued with that grid point."""
    params = {"p": 2, "model.lr": lr, "seed_everything": seed}
    dists = {"p": IntDistribution(2, 2), "model.lr": FloatDistribution(lr, lr),
             "seed_everything": IntDistribution(seed, seed)}
    return create_trial(state=state, params=params, distributions=dists, value=value,
                        intermediate_values=iv or {}, user_attrs=HP if ua is None else ua,
                        system_attrs={"fixed_params": params})


def grid_spec(**kw):
    """A grid spec over p=2, :data:`LRS` and :data:`SEEDS`."""
    points = [{"p": 2, "model.lr": lr, "seed_everything": s}
              for lr, s in itertools.product(LRS, SEEDS)]
    return SimpleNamespace(study="s", profile="cpu", direction="maximize", metric="val/acc",
                           sampler="grid", points=lambda: points, description="", claims=[],
                           settings=[], **kw)


def in_progress():
    """lr 1e-4 and 3e-4 done at every seed (3e-4 best); at 1e-3 seed 0 runs, seed 1 waits,
    seed 2 was never queued."""
    s = optuna.create_study(direction="maximize")
    for seed in SEEDS:
        s.add_trial(trial(1e-4, seed, value=0.5))
        s.add_trial(trial(3e-4, seed, value=0.9))
    s.add_trial(trial(1e-3, 0, state=TrialState.RUNNING))
    s.add_trial(trial(1e-3, 1, state=TrialState.WAITING))
    return s.get_trials()


def test_a_point_still_running_is_flagged_and_its_edge_counts_every_lr():
    (row,) = rows(grid_spec(), in_progress())
    assert (row["best_lr"], row["n_lrs"], row["lr_at_edge"]) == (3e-4, 3, False)
    assert (row["unfinished"], row["not_started"], row["n"]) == (2, 1, 3)
    assert flags(row) == "2 runs unfinished (best lr may change); 1 runs not started"


def test_a_queued_lr_counts_without_the_specs_grid():
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/acc")  # no points()
    (row,) = rows(spec, in_progress())
    assert (row["n_lrs"], row["lr_at_edge"], row["unfinished"], row["not_started"]) == \
        (3, False, 2, 0)


def test_a_finished_point_has_no_progress_flags():
    s = optuna.create_study(direction="maximize")
    for lr, seed in itertools.product(LRS, SEEDS):
        s.add_trial(trial(lr, seed, value={1e-4: 0.5, 3e-4: 0.9, 1e-3: 0.7}[lr]))
    (row,) = rows(grid_spec(), s.get_trials())
    assert (row["unfinished"], row["not_started"], row["lr_at_edge"]) == (0, 0, False)
    assert flags(row) == ""


def test_claims_on_unfinished_rows_are_provisional():
    (row,) = rows(grid_spec(), in_progress())
    other = dict(row, hparams={"feature_map": "LLoPS", "p": 4}, unfinished=0, not_started=0,
                 seed_values={s: v - 0.1 for s, v in row["seed_values"].items()})
    claim = {"name": "p=2 > p=4", "better": {"p": 2}, "worse": {"p": 4}}
    (checked,) = claim_rows([row, other], [claim])
    assert checked["provisional"] and checked["k"] == 3
    assert "provisional" in claims_text([checked])[0]
    (settled,) = claim_rows([dict(row, unfinished=0, not_started=0), other], [claim])
    assert not settled["provisional"] and "provisional" not in claims_text([settled])[0]


def test_a_point_failed_again_after_a_retry_is_one_failed_run():
    s = optuna.create_study(direction="maximize")
    for seed in SEEDS:
        s.add_trial(trial(3e-4, seed, value=0.9))
    for seed in (0, 1):
        s.add_trial(trial(1e-3, seed, value=0.8))
    s.add_trial(trial(1e-3, 2, state=TrialState.FAIL, ua={}))
    s.add_trial(trial(1e-3, 2, state=TrialState.FAIL, ua={}))  # --retry-failed's, failed again
    s.add_trial(trial(1e-4, 0, state=TrialState.FAIL, ua={}))  # retried, and the retry waits
    s.add_trial(trial(1e-4, 0, state=TrialState.WAITING))
    (row,) = rows(SimpleNamespace(study="s", direction="maximize", metric="val/acc"),
                  s.get_trials())
    assert (row["failed"], row["unfinished"]) == (1, 1)
    assert flags(row).startswith("1 runs unfinished (best lr may change); 1 failed (left out)")


def test_runs_csv_keeps_a_per_slice_objective_out_of_val_acc():
    s = optuna.create_study(direction="maximize")
    s.add_trial(trial(1e-3, 0, value=0.40, ua={**HP, "val_acc": 0.90, "last_val_acc": 0.9}))
    s.add_trial(trial(3e-3, 0, state=TrialState.PRUNED, iv={250: 0.20, 500: 0.35}))
    s.add_trial(trial(3e-3, 1, state=TrialState.FAIL, ua={}))
    for metric in ("val/acc_L256_N32", "val/example_acc_L256_N32"):
        spec = SimpleNamespace(study="s", direction="maximize", metric=metric)
        done, pruned, failed = run_rows(spec, s.get_trials())
        assert (done["objective"], done["val_acc"]) == (0.40, 0.90)
        assert (pruned["objective"], pruned["val_acc"], pruned["last_val_acc"],
                pruned["steps"]) == (0.35, None, None, 500)
        assert failed["objective"] is None
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/acc")  # as before
    pruned = run_rows(spec, s.get_trials())[1]
    assert (pruned["objective"], pruned["val_acc"], pruned["last_val_acc"]) == (0.35, 0.35, 0.35)


def test_one_seed_has_no_spread(tmp_path):
    s = optuna.create_study(direction="maximize")
    s.add_trial(trial(3e-4, 0, value=0.936))
    spec = grid_spec()
    spec.points = lambda: [{"p": 2, "model.lr": 3e-4, "seed_everything": 0}]
    table = rows(spec, s.get_trials())
    write_table(spec, table, tmp_path)
    md = (tmp_path / "table.md").read_text()
    assert "| 93.6 (1) |" in md and "± 0.0" not in md
    (got,) = csv.DictReader((tmp_path / "table.csv").open())
    assert (got["acc_mean"], got["acc_std"], got["n"]) == ("0.936", "", "1")
    assert mean_std_text([0.5]) == "50.0 (1)" and mean_std_text([0.5, 0.7]) == "60.0 ± 14.1 (2)"


def test_a_suite_claim_on_provisional_rows_says_so():
    claim = {"status": "ok", "n": 3, "k": 2, "gap_mean": 0.012, "gap_std": 0.004,
             "provisional": False}
    assert claim_text(claim) == "2 of 3, +1.2 ± 0.4"
    assert claim_text({**claim, "provisional": True}) == "2 of 3, +1.2 ± 0.4 (provisional)"
