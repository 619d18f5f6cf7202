"""A study whose spec gains a config after its first trials queues and runs the new one."""

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from paths import config
from test_sweeps import sweep, write_spec

from sweeps.grow import extend_categorical_params
from sweeps.spec import load_spec

OVERLAYS = [config("diagnosis/baseline.yaml"), config("diagnosis/qk_norm.yaml"),
            config("diagnosis/no_fm_decay.yaml")]


def first_trials(tmp_path, url: str) -> list[str]:
    """A study recorded from a spec with the first two overlays: one finished run each."""
    two = load_spec(write_spec(tmp_path, "grow", {"config": OVERLAYS[:2], "seed_everything": [0]}))
    paths = two.choices()["config"]
    study = optuna.create_study(study_name="grow", storage=url, direction="maximize")
    for path, value in zip(paths, (0.4, 0.6)):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=value,
            params={"config": path, "seed_everything": 0, "model.lr": 3e-3},
            distributions={"config": CategoricalDistribution(paths),
                           "seed_everything": IntDistribution(0, 0),
                           "model.lr": FloatDistribution(3e-3, 3e-3)},
            system_attrs={"fixed_params": {"config": path, "seed_everything": 0,
                                           "model.lr": 3e-3}}))
    return paths


def test_extend_adds_the_missing_choices_to_every_trial_and_keeps_values(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    paths = first_trials(tmp_path, url)
    storage = optuna.storages.RDBStorage(url)
    # the new choice goes first in the spec: the recorded order is kept, the new one appended
    wanted = ["new.yaml", *paths]
    assert extend_categorical_params(storage, "grow", {"config": wanted, "seed_everything": [0]}) \
        == {"config": ["new.yaml"]}
    trials = optuna.load_study(study_name="grow", storage=url).get_trials()
    assert [t.params["config"] for t in trials] == paths
    assert all(t.distributions["config"].choices == (*paths, "new.yaml") for t in trials)
    assert extend_categorical_params(storage, "grow", {"config": wanted}) == {}


def test_sweep_run_queues_and_runs_a_config_added_to_a_recorded_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    paths = first_trials(tmp_path, url)
    three = write_spec(tmp_path, "grow", {"config": OVERLAYS, "seed_everything": [0]})
    out = sweep("run", str(three), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1 newly queued" in out.stdout
    trials = optuna.load_study(study_name="grow", storage=url).get_trials()
    assert [(t.params["config"], t.state) for t in trials[:2]] == \
        [(p, TrialState.COMPLETE) for p in paths]
    assert trials[2].state == TrialState.COMPLETE and trials[2].params["config"] not in paths
    assert trials[2].params["config"].endswith("no_fm_decay.yaml")
