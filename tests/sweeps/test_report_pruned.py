"""A run the pruner stopped counts in its lr's mean with the best it had reached."""

from types import SimpleNamespace

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.report import study_trials
from sweeps.report.rows import rows
from sweeps.report.runs import run_rows
from sweeps.report.table import flags
from sweeps.trials import best_lr, by_point_and_lr, run_value


def trial(lr, seed, curve, pruned=False):
    params = {"p": 2, "model.lr": lr, "seed_everything": seed}
    dists = {"p": IntDistribution(2, 2), "model.lr": FloatDistribution(lr, lr),
             "seed_everything": IntDistribution(seed, seed)}
    return create_trial(
        state=TrialState.PRUNED if pruned else TrialState.COMPLETE, params=params,
        distributions=dists, value=None if pruned else max(curve.values()),
        intermediate_values=curve, user_attrs={} if pruned else {"hparams": {"p": 2}})


def study(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    s = optuna.create_study(study_name="s", storage=url, direction="maximize")
    # lr 1e-3: seed 0 finished best of all, seed 1 was stopped early far behind; lr 3e-4:
    # both seeds finished at 0.9. Averaged over its survivors only, 1e-3 would win (0.95).
    for t in (trial(3e-4, 0, {500: 0.5, 3000: 0.9}), trial(3e-4, 1, {500: 0.5, 3000: 0.9}),
              trial(1e-3, 0, {500: 0.6, 3000: 0.95}),
              trial(1e-3, 1, {500: 0.2, 1000: 0.1}, pruned=True)):
        s.add_trial(t)
    return url, s


def test_pruned_run_counts_with_its_best_reached(tmp_path):
    url, s = study(tmp_path)
    trials = s.get_trials()
    assert run_value(trials[3]) == 0.2 and run_value(trials[3], maximize=False) == 0.1
    (by_lr,) = by_point_and_lr(trials).values()
    assert len(by_lr[1e-3]) == 2
    assert best_lr(by_lr) == 3e-4
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/acc")
    (row,) = rows(spec, study_trials(spec, url))
    assert row["best_lr"] == 3e-4 and row["n"] == 2 and row["pruned"] == 0
    assert row["lr_means"][1e-3] == (0.95 + 0.2) / 2
    runs = run_rows(spec, study_trials(spec, url))
    assert (runs[3]["state"], runs[3]["val_acc"], runs[3]["last_val_acc"],
            runs[3]["steps"]) == ("pruned", 0.2, 0.1, 1000)


def test_row_flags_pruned_runs_at_its_best_lr():
    row = {"collapsed": 0, "pruned": 1, "lr_at_edge": False}
    assert flags(row) == "1 pruned"
