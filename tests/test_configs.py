"""Configs with one job each: method configs name the mixers, the feature map, the run (and
any other architecture option of the method); size configs (configs/sizes/) the model size;
profiles the data, trainer and optimiser budget. No key is set by two kinds, so the order of
--config files does not change the model."""

import itertools

import pytest
import yaml
from paths import ROOT, config

from arbench.cli import run
from sweeps.report.labels import TASK_MODEL_KEYS

CONFIGS = ROOT / "configs"
METHODS = sorted(CONFIGS.glob("*.yaml"))
SIZES = sorted((CONFIGS / "sizes").glob("*.yaml"))
PROFILES = sorted((CONFIGS / "profiles").glob("*.yaml"))
OPTIMISER = {"lr", "weight_decay", "warmup_steps", "min_lr_ratio", "feature_map_weight_decay"}
SIZE = {"d_model", "num_heads", "n_layers"}


def load(path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", METHODS, ids=lambda p: p.name)
def test_method_configs_hold_mixers_feature_map_and_run_name(path):
    raw = load(path)
    assert set(raw) <= {"model", "trainer"}
    assert {"mixers", "feature_map"} <= set(raw["model"])
    assert not set(raw["model"]) & (SIZE | OPTIMISER | {"vocab_size"})
    assert set(raw["trainer"]) == {"logger"} and set(raw["trainer"]["logger"]) == {"init_args"}
    assert set(raw["trainer"]["logger"]["init_args"]) == {"name"}


@pytest.mark.parametrize("path", SIZES, ids=lambda p: p.name)
def test_size_configs_hold_the_model_size(path):
    raw = load(path)
    assert set(raw) == {"model"} and set(raw["model"]) <= SIZE


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_profiles_hold_data_trainer_and_optimiser_budget(path):
    """A profile sets data, budget and optimiser; of the model, only what a task needs of every
    method alike: the position embeddings, covering every sequence of its data, and the depth
    (``n_layers``, a whole number of the method's mixer cycles)."""
    raw = load(path)
    assert set(raw) <= {"data", "trainer", "model"}
    assert set(raw.get("model", {})) <= OPTIMISER | set(TASK_MODEL_KEYS)
    positions = raw.get("model", {}).get("max_position_embeddings")
    if positions:
        data = raw["data"]
        assert positions >= max(s["seq_len"] for s in data["train_segments"]
                                + data["test_segments"])
    depth = raw.get("model", {}).get("n_layers")
    if depth is not None:
        assert depth % 2 == 0, "every method config cycles two mixers (conv, then attention)"


def model_section(capsys, files: list[str]) -> dict:
    with pytest.raises(SystemExit):
        run(["fit", *itertools.chain.from_iterable(("--config", f) for f in files),
             "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)["model"]


@pytest.mark.parametrize("files", [
    [config("p4.yaml"), config("profiles/cpu.yaml")],
    [config("p4.yaml"), config("profiles/smoke.yaml"), config("sizes/tiny.yaml")],
    [config("teacher.yaml"), config("sizes/teacher.yaml"), config("profiles/cpu.yaml")],
    [config("zoology_based.yaml"), config("profiles/smoke.yaml"), config("sizes/tiny.yaml")],
])
def test_order_of_config_files_does_not_change_the_model(capsys, files):
    models = [model_section(capsys, list(order)) for order in itertools.permutations(files)]
    assert all(m == models[0] for m in models)


def test_method_and_profile_train_the_default_size(capsys):
    """p4 with the cpu profile: the model's default size, d_model 128 and one head, as the
    method configs used to state."""
    model = model_section(capsys, [config("p4.yaml"), config("profiles/cpu.yaml")])
    assert (model["d_model"], model["num_heads"], model["n_layers"]) == (128, 1, 2)
    assert model["feature_map"]["init_args"]["p"] == 4 and model["lr"] == 3.0e-3
    tiny = model_section(capsys, [config("p4.yaml"), config("profiles/smoke.yaml"),
                                  config("sizes/tiny.yaml")])
    assert tiny["d_model"] == 32
