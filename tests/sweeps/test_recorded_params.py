"""rewrite_params changes the distributions it is asked to, in every trial, and keeps values."""

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from sweeps.recorded_params import rewrite_params


def test_rewrite_keeps_values_and_leaves_rows_it_returns_none_for(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="s", storage=url)
    for lr, tag in ((1e-3, "a"), (3e-3, "b")):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=lr,
            params={"lr": lr, "tag": tag},
            distributions={"lr": CategoricalDistribution([1e-3, 3e-3]),
                           "tag": CategoricalDistribution(["a", "b"])}))
    seen = []

    def lift_lr(name, dist, value):
        seen.append((name, value))
        return FloatDistribution(value, value) if name == "lr" else None

    assert rewrite_params(optuna.storages.RDBStorage(url), "s", lift_lr) == 2
    assert sorted(seen) == [("lr", 1e-3), ("lr", 3e-3), ("tag", "a"), ("tag", "b")]
    trials = optuna.load_study(study_name="s", storage=url).get_trials()
    assert [t.params for t in trials] == [{"lr": 1e-3, "tag": "a"}, {"lr": 3e-3, "tag": "b"}]
    assert [t.distributions["lr"] for t in trials] == \
        [FloatDistribution(1e-3, 1e-3), FloatDistribution(3e-3, 3e-3)]
    assert all(t.distributions["tag"] == CategoricalDistribution(["a", "b"]) for t in trials)
