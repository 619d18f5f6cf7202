"""How a run trained (precision, zoology's recipe) reaches row labels, claims and runs.csv;
a spec may take zoology's per-example metric as its objective."""

from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from paths import config

from arbench.defaults import ZOOLOGY_RECIPE
from sweeps.report import study_trials
from sweeps.report.labels import label
from sweeps.report.rows import rows
from sweeps.report.runs import run_rows
from sweeps.report.table import claim_rows, write_table
from sweeps.spec import SpecError, load_spec

BASE = {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1}


def test_labels_name_precision_and_recipe():
    assert label(BASE) == "LLoPS p=4 m=256 t=1"  # recorded before precision was an hparam
    assert label({**BASE, "precision": "32-true", "lr_schedule": "cosine"}) == label(BASE)
    assert label({**BASE, "precision": "bf16-mixed"}) == "LLoPS p=4 m=256 t=1 bf16-mixed"
    assert label({**BASE, **ZOOLOGY_RECIPE, "precision": "bf16-mixed"}) == \
        "LLoPS p=4 m=256 t=1 zoology recipe bf16-mixed"
    assert label({**BASE, "betas": "0.9,0.999", "shuffle": False}) == \
        "LLoPS p=4 m=256 t=1 betas 0.9,0.999 unshuffled"


def test_labels_name_a_depth_other_than_the_default():
    import inspect

    from arbench.defaults import DEFAULT_N_LAYERS
    from arbench.lit import LitRecall
    assert DEFAULT_N_LAYERS == inspect.signature(LitRecall).parameters["n_layers"].default
    assert label({**BASE, "n_layers": DEFAULT_N_LAYERS}) == label(BASE)
    assert label({**BASE, "n_layers": 4, "max_position_embeddings": 256}) == \
        "LLoPS p=4 m=256 t=1 pos-emb 4 layers"
    softmax = {"feature_map": "softmax", "n_layers": 4, "max_position_embeddings": 256}
    assert label(softmax) == "softmax pos-emb 4 layers"
    assert label({**softmax, "n_layers": 2, "max_position_embeddings": 0,
                  "precision": "bf16-mixed"}) == "softmax bf16-mixed"


def test_claims_select_rows_by_precision():
    table = [{"hparams": BASE, "seed_values": {0: 0.90, 1: 0.95}},  # an fp32 run of old
             {"hparams": {**BASE, "precision": "bf16-mixed"}, "seed_values": {0: 0.91, 1: 0.9}}]
    claim = {"name": "bf16 >= fp32", "better": {"p": 4, "precision": "bf16-mixed"},
             "worse": {"p": 4, "precision": "32-true"}}
    (got,) = claim_rows(table, [claim])
    assert (got["status"], got["k"], got["n"]) == ("ok", 1, 2)
    assert got["gap_mean"] == pytest.approx(-0.02)


def trial(precision, seed, value, example):
    params = {"trainer.precision": precision, "model.lr": 1e-3, "seed_everything": seed}
    dists = {"trainer.precision": CategoricalDistribution(["32-true", "bf16-mixed"]),
             "model.lr": FloatDistribution(1e-3, 1e-3),
             "seed_everything": IntDistribution(seed, seed)}
    attrs = {"hparams": {**BASE, "precision": precision}, "val_acc": value,
             "slices": {"L64_N4": value}}
    if example is not None:
        attrs.update(example_acc=example, last_example_acc=example)
    return create_trial(state=TrialState.COMPLETE, params=params, distributions=dists,
                        value=value, intermediate_values={100: value}, user_attrs=attrs)


def study(tmp_path, with_example: bool):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    s = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for precision, seed, value in (("32-true", 0, 0.9), ("32-true", 1, 0.8),
                                   ("bf16-mixed", 0, 0.7)):
        s.add_trial(trial(precision, seed, value, value - 0.1 if with_example else None))
    return url


def test_example_metric_in_runs_and_table(tmp_path):
    url = study(tmp_path, with_example=True)
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/acc", profile="long",
                           description="", claims=[])
    runs = run_rows(spec, study_trials(spec, url))
    assert [r["example_acc"] for r in runs] == pytest.approx([0.8, 0.7, 0.6])
    assert [r["trainer.precision"] for r in runs] == ["32-true", "32-true", "bf16-mixed"]
    table = rows(spec, study_trials(spec, url))
    write_table(spec, table, tmp_path)
    md = (tmp_path / "table.md").read_text()
    assert " | example acc % | " in md
    assert "75.0 ± 7.1 (2)" in md  # fp32: (0.8 + 0.7) / 2 over seeds
    assert "LLoPS p=4 m=256 t=1 bf16-mixed" in md
    header = (tmp_path / "table.csv").read_text().splitlines()[0]
    assert "example_acc_mean" in header


def test_runs_without_example_metric_keep_their_columns(tmp_path):
    """Studies recorded before zoology's metric regenerate their runs.csv and tables as they
    were: no new columns."""
    url = study(tmp_path, with_example=False)
    spec = SimpleNamespace(study="s", direction="maximize", metric="val/acc", profile="cpu",
                           description="", claims=[])
    assert "example_acc" not in run_rows(spec, study_trials(spec, url))[0]
    write_table(spec, rows(spec, study_trials(spec, url)), tmp_path)
    assert "example" not in (tmp_path / "table.md").read_text()
    assert "example" not in (tmp_path / "table.csv").read_text()


def test_spec_objective_is_a_logged_accuracy(tmp_path):
    def spec(objective):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({"study": "s", "configs": [config("p4.yaml")],
                                        "grid": {"precision": ["32-true", "bf16-mixed"]},
                                        "objective": objective}))
        return load_spec(path)

    loaded = spec({"metric": "val/example_acc"})
    assert loaded.metric == "val/example_acc"
    assert [p["trainer.precision"] for p in loaded.points()] == ["32-true", "bf16-mixed"]
    with pytest.raises(SpecError, match="objective.metric must be val/acc, val/example_acc"):
        spec({"metric": "train/loss"})


def test_plot_of_one_slice_uses_its_per_seed_values():
    from sweeps.report.plots import plotted_rows, plotted_value, y_label

    row = {"hparams": {"state_size": 10}, "mean": 0.5, "std": 0.1,
           "slice_values": {"L1024_N256": [0.2, 0.4]}}
    plain, hardest = {"x": "state_size"}, {"x": "state_size", "y": "L1024_N256"}
    assert plotted_value(row, plain) == (50.0, 10.0)
    mean, std = plotted_value(row, hardest)
    assert mean == pytest.approx(30.0) and std == pytest.approx(100 * 0.1414, abs=0.01)
    assert plotted_rows([row], {"x": "state_size", "y": "L64_N4"}) == []  # no such slice
    assert y_label(hardest) == "accuracy on L1024_N256 % (mean ± std over seeds)"
