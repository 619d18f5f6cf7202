"""A zipped grid row's null leaves its key to the point's config (one grid over methods with
different keys), and the specs of the long profile load."""

import pytest
import yaml
from paths import ROOT, config

from sweeps.__main__ import main
from sweeps.command import trial_args
from sweeps.names import trial_name
from sweeps.spec import SpecError, load_spec


def test_zipped_null_leaves_the_key_out(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "study": "s", "configs": [], "grid": {
            "config,model.feature_map.init_args.r,m": [[config("based.yaml"), 8, None],
                                                       [config("p4.yaml"), None, 64]]},
        "lr": [1e-3]}))
    based, llops = load_spec(path).points()
    assert based == {"config": config("based.yaml"), "model.feature_map.init_args.r": 8,
                     "model.lr": 1e-3}
    assert llops == {"config": config("p4.yaml"), "model.feature_map.init_args.m": 64,
                     "model.lr": 1e-3}
    assert trial_name(llops) == "cfgp4_m64_lr0.001"
    args = trial_args(load_spec(path), llops, "runs/s", "x")
    assert "--model.feature_map.init_args.m=64" in args
    assert not any("init_args.r" in a for a in args)


def test_bf16_parity_pairs_each_method_with_its_lrs():
    spec = load_spec(ROOT / "sweeps" / "bf16_parity.yaml")
    points = spec.points()
    assert len(points) == 12 * 2 * 3
    assert {p["trainer.precision"] for p in points} == {"32-true", "bf16-mixed"}
    based = {p["model.lr"] for p in points if p["config"].endswith("based.yaml")}
    assert based == {3.0e-4, 1.0e-3, 3.0e-3}
    assert [c["parity"] for c in spec.claims] == [1.0] * 4


@pytest.mark.parametrize("bad", [-1, "one", True])
def test_a_parity_claim_needs_points(tmp_path, bad):
    text = (ROOT / "sweeps" / "bf16_parity.yaml").read_text().replace("parity: 1.0}",
                                                                       f"parity: {bad}}}", 1)
    path = tmp_path / "bf16_parity.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"claims\[0\]\.parity must be a number of points >= 0"):
        load_spec(path)


@pytest.mark.parametrize("name", ["long_p_ablation", "long_based_vs_llops", "frontier",
                                  "long_noise", "long_noise_repeat", "calibration_long",
                                  "long_warmstart_based", "long_warmstart", "calibration_long_6k"])
def test_long_profile_specs_load(name):
    spec = load_spec(ROOT / "sweeps" / f"{name}.yaml")
    assert spec.profile == "long" and spec.points()
    assert load_spec(ROOT / "sweeps" / f"{name}.yaml", "smoke").points()


def test_long_parity_and_the_long_studies_share_their_fp32_runs():
    """bf16_parity_long's fp32 LLoPS p=4 and BASED points are long_p_ablation's and
    long_based_vs_llops' experiments (each reuses the other's finished runs), its bf16 arms are
    not."""
    from sweeps.command import trial_args
    from sweeps.reuse import experiment

    def experiments(name):
        spec = load_spec(ROOT / "sweeps" / f"{name}.yaml")
        assert "bf16_parity_long" in spec.reuse or name == "bf16_parity_long"
        return {experiment(trial_args(spec, p, "runs", "x")): p for p in spec.points()}

    parity = experiments("bf16_parity_long")
    long_runs = {**experiments("long_p_ablation"), **experiments("long_based_vs_llops")}
    shared = [p for e, p in parity.items() if e in long_runs]
    assert len(shared) == 18  # p=4 and BASED x 3 lrs x 3 seeds
    assert all(p["trainer.precision"] == "32-true" for p in shared)


def test_config_paths_resolve_from_any_folder_zipped_and_in_args(tmp_path, monkeypatch):
    """A zipped ``config`` (``"config,m"``) and a ``--config`` file among ``args`` resolve like
    ``config:`` values: relative to the repo when the working folder has no such file."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "study": "s", "configs": [], "grid": {"config,m": [["configs/p2.yaml", 64],
                                                         ["configs/based.yaml", None]]},
        "lr": [1e-3], "args": ["--config", "configs/tasks/overwrite_smoke.yaml",
                               "--config=configs/sizes/tiny.yaml", "--trainer.max_steps=3"]}))
    monkeypatch.chdir(tmp_path)
    spec = load_spec(path)
    assert [p["config"] for p in spec.points()] == [config("p2.yaml"), config("based.yaml")]
    assert spec.args == ["--config", config("tasks/overwrite_smoke.yaml"),
                         f"--config={config('sizes/tiny.yaml')}", "--trainer.max_steps=3"]
    path.write_text(path.read_text().replace("overwrite_smoke", "nothing_smoke"))
    with pytest.raises(SpecError, match="config file not found: configs/tasks/nothing_smoke"):
        load_spec(path)


@pytest.mark.parametrize("bad, got", [(5, "int"), ("", "empty text"),
                                      (["postgresql://alice:TopSecret99@h/db"], "list")])
def test_storage_must_be_a_url(tmp_path, monkeypatch, capsys, bad, got):
    """A spec's ``storage:`` that is no text stops ``load_spec`` (and the command) in one line
    naming the file and the key, without showing the value (it may hold a password)."""
    path = tmp_path / "s.yaml"
    spec = {"study": "s", "configs": [config("p4.yaml")], "grid": {"seed_everything": [0]},
            "lr": [1e-3]}
    path.write_text(yaml.safe_dump({**spec, "storage": None}))
    assert load_spec(path).storage is None
    path.write_text(yaml.safe_dump({**spec, "storage": bad}))
    with pytest.raises(SpecError, match=f"^{path}: storage must be a storage URL "
                                        fr"\(non-empty text\), got {got}$"):
        load_spec(path)
    path.write_text(yaml.safe_dump({**spec, "profiles": {"smoke": {"storage": bad}}}))
    with pytest.raises(SpecError, match="storage must be a storage URL"):
        load_spec(path, "smoke")
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(path), "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}: storage must be a storage URL (non-empty text), got {got}\n"
