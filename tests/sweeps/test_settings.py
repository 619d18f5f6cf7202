"""A spec's ``settings:``: a task's difficulty settings, each trained as a run of its own (MAD's
protocol), and merged per point into a task score for claims and the suite.

The spec runs every grid point once per setting with the setting's overlay after the profile;
each setting picks its own best lr; a point's task score per seed is the mean over the
settings, only for seeds (and points) that have every setting. Synthetic trials check the
numbers against hand-computed ones; one smoke-size sweep runs end to end.
"""

import csv
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState, create_trial
from paths import ROOT
from test_sweep_errors import one_error_line
from test_sweeps import sweep

from sweeps.__main__ import main
from sweeps.command import trial_args
from sweeps.names import trial_name
from sweeps.params import point_distributions
from sweeps.report.rows import rows
from sweeps.report.settings import task_rows
from sweeps.spec import SpecError, load_spec

SMALL = str(ROOT / "configs/settings/copy_L32_T4.yaml")
LARGE = str(ROOT / "configs/settings/copy_L64_T8.yaml")


def write_spec(tmp: Path, study: str, settings=(SMALL, LARGE), **extra) -> Path:
    """LLoPS p = 2 and 4, two seeds, two lrs, at each of ``settings``, and one claim."""
    path = tmp / f"{study}.yaml"
    path.write_text(yaml.safe_dump({
        "study": study, "configs": [], "profile": "smoke", "settings": list(settings),
        "grid": {"p": [2, 4], "seed": [0, 1]}, "lr": [1e-3, 3e-3],
        "claims": [{"name": "p=4 > p=2", "better": {"p": 4}, "worse": {"p": 2}}], **extra}))
    return path


def test_every_point_runs_once_per_setting_with_its_overlay_after_the_profile(tmp_path):
    spec = load_spec(write_spec(tmp_path, "s", args=["--trainer.max_steps=7"]))
    points = spec.points()
    assert len(points) == 2 * 2 * 2 * 2
    assert [p["setting"] for p in points[:4]] == [SMALL, LARGE, SMALL, LARGE]  # the last axis
    args = trial_args(spec, points[1], "runs/s", "x")
    at = args.index(LARGE)
    assert args[at - 1] == "--config" and args.index(spec.profile_path) < at
    assert args.index("--trainer.max_steps=7") < at  # the spec's args, then the setting
    assert not any(a.startswith("--setting") for a in args)
    assert trial_name(points[1]) == "p2_lr0.001_seed0_set-copy_L64_T8"


@pytest.mark.parametrize("settings, extra, message", [
    (["configs/settings/copy_L32_T4.yaml", "elsewhere/copy_L32_T4.yaml"], {},
     "settings names copy_L32_T4 twice"),
    (["configs/settings/copy_L32_T4.json"], {}, "settings must be a list of config overlay"),
    ([SMALL], {"grid": {"setting": [SMALL], "seed": [0]}}, "grid names 'setting'"),
    ([str(ROOT / "configs/settings/no_such.yaml")], {}, "config file not found"),
])
def test_bad_settings_stop_with_one_line(tmp_path, settings, extra, message):
    with pytest.raises(SpecError, match=message):
        load_spec(write_spec(tmp_path, "bad", settings, **extra))
    path = write_spec(tmp_path, "bad", settings, **extra)
    done = sweep("run", str(path), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
                 cwd=tmp_path)
    assert done.returncode != 0 and message in one_error_line(done.stderr)


def record(url: str, spec_path: Path, runs: dict[tuple, tuple[float, float]],
           attrs: dict[tuple, dict] | None = None) -> None:
    """Record ``{(p, seed, lr, setting): (objective, slice accuracy)}`` as finished trials, each
    run's one test slice named after its setting; ``attrs``: more user attrs of some runs."""
    spec = load_spec(spec_path)
    study = optuna.create_study(study_name=spec.study, storage=url, direction="maximize")
    for point in spec.points():
        setting = Path(point["setting"]).stem
        key = (point["model.feature_map.init_args.p"], point["seed_everything"],
               point["model.lr"], setting)
        if key not in runs:
            continue
        value, acc = runs[key]
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=value, params=point,
            distributions=point_distributions(point, spec, {}),
            user_attrs={"slices": {setting: acc}, "hparams": {
                "feature_map": "LLoPS", "p": key[0], "m": 64, "rank": 1, "state_size": 2048},
                **(attrs or {}).get(key, {})},
            system_attrs={"fixed_params": point}))


S, L = "copy_L32_T4", "copy_L64_T8"
# p = 2: the small setting is best at 1e-3, the large one at 3e-3 (each picks its own lr; the
# other lr's values are high on the slices, so a shared pick would show). Seed 1 has no run
# at the large setting's best lr: its task score is undefined.
# p = 4: both settings best at 3e-3, both seeds: task scores (0.9 + 0.5) / 2 and (0.7 + 0.3) / 2.
RUNS = {(2, 0, 1e-3, S): (0.8, 0.8), (2, 1, 1e-3, S): (0.6, 0.6),
        (2, 0, 3e-3, S): (0.1, 0.99), (2, 1, 3e-3, S): (0.1, 0.99),
        (2, 0, 1e-3, L): (0.2, 0.99), (2, 1, 1e-3, L): (0.2, 0.99),
        (2, 0, 3e-3, L): (0.4, 0.4),
        (4, 0, 3e-3, S): (0.9, 0.9), (4, 1, 3e-3, S): (0.7, 0.7),
        (4, 0, 3e-3, L): (0.5, 0.5), (4, 1, 3e-3, L): (0.3, 0.3)}


@pytest.fixture
def recorded(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "t_copy")
    record(url, path, RUNS)
    return url, path


def test_task_rows_average_each_seed_over_the_settings_at_their_own_best_lrs(recorded):
    url, path = recorded
    spec = load_spec(path)
    table = rows(spec, optuna.load_study(study_name="t_copy", storage=url).get_trials())
    assert len(table) == 4  # a row per point and setting
    merged = {r["hparams"]["p"]: r for r in task_rows(spec, table)}
    assert "setting" not in merged[2]["hparams"]
    assert merged[2]["best_lrs"] == {S: 1e-3, L: 3e-3}
    assert merged[2]["seed_values"] == pytest.approx({0: (0.8 + 0.4) / 2})  # seed 1: no L run
    assert merged[4]["seed_scores"] == pytest.approx({0: 0.7, 1: 0.5})
    # the settings' runs the grid asks for and nobody queued: p = 2 lacks (seed 1, 3e-3, L),
    # p = 4 every run at 1e-3; the task row sums them (a provisional row)
    assert (merged[2]["not_started"], merged[4]["not_started"]) == (1, 4)
    assert merged[2]["unfinished"] == merged[4]["unfinished"] == 0
    missing = task_rows(spec, [r for r in table if not (r["hparams"]["p"] == 4
                                                       and r["hparams"]["setting"] == L)])
    p4 = next(r for r in missing if r["hparams"]["p"] == 4)
    assert (p4["seed_values"], p4["settings_done"], p4["settings"]) == ({}, 1, 2)


def test_the_table_names_each_setting_and_checks_claims_on_the_task_score(recorded, tmp_path):
    url, path = recorded
    out = tmp_path / "report"
    assert main(["report", str(path), "--storage", url, "--out", str(out)]) == 0
    md = (out / "t_copy" / "table.md").read_text()
    assert "| LLoPS p=2 m=64 t=1 on copy_L32_T4 | " in md
    assert "| LLoPS p=4 m=64 t=1 on copy_L64_T8 | " in md
    assert "the mean over the 2 settings" in md
    # seed 0 only (p = 2 has no task score at seed 1): 0.9/0.5 against 0.8/0.4 -> +0.1
    assert "p=4 > p=2: holds in 1 of 1 seeds" in md
    with (out / "t_copy" / "runs.csv").open() as fh:
        runs = list(csv.DictReader(fh))
    assert {Path(r["setting"]).stem for r in runs} == {S, L}


def test_the_suite_cell_is_the_task_score_with_each_settings_best_lr(recorded, tmp_path):
    url, path = recorded
    out = tmp_path / "suite"
    assert main(["suite", str(path), "--storage", url, "--out", str(out)]) == 0
    with (out / "table.csv").open() as fh:
        table = {r["method"]: r for r in csv.DictReader(fh)}
    assert sorted(table) == ["LLoPS p=2 m=64 t=1", "LLoPS p=4 m=64 t=1"]
    p2, p4 = table["LLoPS p=2 m=64 t=1"], table["LLoPS p=4 m=64 t=1"]
    assert float(p4["t_copy_mean"]) == pytest.approx(0.6) and p4["t_copy_n"] == "2"
    assert float(p2["t_copy_mean"]) == pytest.approx((0.8 + 0.4) / 2) and p2["t_copy_n"] == "1"
    assert p2["t_copy_best_lr"] == f"{S}=0.001;{L}=0.003"
    assert p2["t_copy_partial"] == "True"  # seed 1 at 3e-3 on the large setting never ran
    md = (out / "table.md").read_text()
    assert f"| LLoPS p=2 m=64 t=1 | {S} 0.001, {L} 0.003 |" in md


@pytest.mark.filterwarnings("ignore:Choices for a categorical distribution")
def test_a_spec_with_settings_runs_each_at_smoke_size(tmp_path):
    """The selective-copying calibration's smoke profile: one point at two settings, each run
    trained and tested on its own setting alone."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = str(ROOT / "sweeps" / "calibration_selective_copying.yaml")
    ran = sweep("run", spec, "--profile", "smoke", "--size", "tiny", "--storage", url,
                "--runs", str(tmp_path / "runs"), "--threads", "1", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    trials = optuna.load_study(study_name="calibration_selective_copying_3",
                               storage=url).get_trials()
    assert sorted(list(t.user_attrs["slices"]) for t in trials) == [[S], [L]]
    out = tmp_path / "report"
    done = sweep("report", spec, "--profile", "smoke", "--storage", url, "--out", str(out),
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    md = (out / "calibration_selective_copying_3" / "table.md").read_text()
    assert f"| LLoPS p=2 m=256 t=1 on {S} | " in md and f"| LLoPS p=2 m=256 t=1 on {L} | " in md


def test_selective_copyings_settings_each_train_and_test_one_setting_on_its_profile():
    """The profile trains MAD's baseline, as its first setting's overlay does; every overlay
    builds on the profile (``sweep run`` checks every point so) with one setting alone."""
    from sweeps.command import validate_points  # here: builds models and data (torch)

    spec = load_spec(ROOT / "sweeps" / "suite_selective_copying.yaml")
    profile = yaml.safe_load(Path(spec.profile_path).read_text())["data"]
    for path, tokens in zip(spec.settings, (16, 32, 64)):
        data = yaml.safe_load((ROOT / path).read_text())["data"]
        assert set(data) == {"train_segments", "test_segments"}
        assert [s["num_tokens_to_copy"] for s in data["train_segments"] + data["test_segments"]] \
            == [tokens, tokens]
        assert Path(path).stem == f"copy_L256_T{tokens}"  # the slice it tests
        if tokens == 16:
            assert data == {k: profile[k] for k in data}
    calibration = load_spec(ROOT / "sweeps" / "calibration_selective_copying.yaml")
    assert calibration.settings == spec.settings
    validate_points(calibration)


def test_claims_and_suite_cells_say_how_many_settings_a_point_has_run(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "t_copy")
    record(url, path, {k: v for k, v in RUNS.items() if not (k[0] == 4 and k[3] == L)})
    assert main(["report", str(path), "--storage", url, "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "t_copy" / "table.md").read_text()
    assert "- p=4 > p=2: not checked (better has run at 1 of 2 settings)" in md
    assert main(["suite", str(path), "--storage", url, "--out", str(tmp_path / "s")]) == 0
    assert "| LLoPS p=4 m=64 t=1 | 2048 | – (1 of 2 settings)* |" in \
        (tmp_path / "s" / "table.md").read_text()
    merged = task_rows(load_spec(path), rows(load_spec(path), optuna.load_study(
        study_name="t_copy", storage=url).get_trials()))
    p2 = next(r for r in merged if r["hparams"]["p"] == 2)
    assert (p2["n"], p2["mean"], p2["std"]) == (1, pytest.approx(0.6), 0.0)
    assert sorted(p2["slice_values"]) == [S, L]  # each setting's own slice


def test_a_setting_needs_a_grid_sweep(tmp_path):
    with pytest.raises(SpecError, match="settings: needs sampler: grid"):
        load_spec(write_spec(tmp_path, "tpe", sampler="tpe", n_trials=4))


def test_a_study_keeps_the_settings_it_began_with(tmp_path):
    """A spec that gains settings: after its study ran would queue its whole grid again beside
    runs its tables cannot merge: it stops with one line."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"study": "t_copy", "configs": [], "profile": "smoke",
                                     "grid": {"p": [2], "seed": [0]}, "lr": [1e-3]}))
    spec = load_spec(plain)
    study = optuna.create_study(study_name="t_copy", storage=url, direction="maximize")
    point = spec.points()[0]
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, params=point,
                                 distributions=point_distributions(point, spec, {}),
                                 system_attrs={"fixed_params": point}))
    gained = write_spec(tmp_path, "t_copy", configs=[str(ROOT / "configs/p4.yaml")])
    done = sweep("run", str(gained), "--storage", url, cwd=tmp_path)
    assert done.returncode != 0
    assert "study t_copy has runs without a setting; give the spec a new study name" in \
        one_error_line(done.stderr)


def test_best_of_a_study_with_settings_is_the_run_at_the_trials_own_setting(tmp_path):
    from sweeps.refs import RefError, best_checkpoint

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "stage1", lr=[1e-3])
    spec = load_spec(path)
    study = optuna.create_study(study_name="stage1", storage=url, direction="maximize")
    for point in spec.points():
        if point["model.feature_map.init_args.p"] != 2:
            continue
        ckpt = tmp_path / f"{trial_name(point)}.ckpt"
        ckpt.write_text("")
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=0.5, params=point,
            distributions=point_distributions(point, spec, {}),
            user_attrs={"last_checkpoint": str(ckpt)}, system_attrs={"fixed_params": point}))
    got = best_checkpoint("stage1", 1, url, "elsewhere/copy_L64_T8.yaml")  # by the setting's name
    assert Path(got).name == "p2_lr0.001_seed1_set-copy_L64_T8.ckpt"
    with pytest.raises(RefError, match="trains one run per setting"):
        best_checkpoint("stage1", 1, url)
    with pytest.raises(RefError, match="no run at setting copy_L256_T16"):
        best_checkpoint("stage1", 1, url, "configs/settings/copy_L256_T16.yaml")


def test_a_study_keeps_which_settings_it_began_with_in_any_order(tmp_path):
    from sweeps.queue import check_settings_kept

    began = load_spec(write_spec(tmp_path, "t_copy")).points()
    check_settings_kept(load_spec(write_spec(tmp_path, "t_copy", (LARGE, SMALL))), began)
    other = str(ROOT / "configs/settings/copy_L256_T16.yaml")
    with pytest.raises(SpecError, match=r"lists settings \['copy_L256_T16', 'copy_L64_T8'\], "
                       r"but study t_copy began with \['copy_L32_T4', 'copy_L64_T8'\]"):
        check_settings_kept(load_spec(write_spec(tmp_path, "t_copy", (LARGE, other))), began)


def test_a_point_whose_settings_share_no_seed_at_their_best_lrs_says_so(tmp_path):
    """Each setting has run, but seed 0 only at the small setting's best lr and seed 1 only
    at the large one's: no task score yet, and the claim and the cell say why."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "t_copy")
    record(url, path, {(2, 0, 1e-3, S): (0.8, 0.8), (2, 1, 3e-3, L): (0.4, 0.4),
                       **{k: v for k, v in RUNS.items() if k[0] == 4}})
    spec = load_spec(path)
    merged = task_rows(spec, rows(spec, optuna.load_study(study_name="t_copy",
                                                          storage=url).get_trials()))
    p2 = next(r for r in merged if r["hparams"]["p"] == 2)
    assert (p2["settings_done"], p2["n"], p2["short_of_seeds"]) == (2, 0, True)
    assert main(["report", str(path), "--storage", url, "--out", str(tmp_path / "r")]) == 0
    assert "- p=4 > p=2: not checked (worse has no seed run at every setting's best lr yet)" \
        in (tmp_path / "r" / "t_copy" / "table.md").read_text()
    assert main(["suite", str(path), "--storage", url, "--out", str(tmp_path / "s")]) == 0
    assert "| LLoPS p=2 m=64 t=1 | 2048 | – (no seed at every setting yet)* |" in \
        (tmp_path / "s" / "table.md").read_text()


def test_a_queued_widened_lr_leaves_the_cell_partial_and_the_state_size_is_the_first_settings(
        tmp_path):
    from sweeps.report.suite import task_cells

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "t_copy")
    record(url, path, {**RUNS, **{(4, seed, 1e-3, s): (0.2, 0.2) for seed in (0, 1)
                                  for s in (S, L)}})  # every run of p = 4
    spec = load_spec(path)
    study = optuna.load_study(study_name="t_copy", storage=url)
    def p4_partial() -> bool:
        cells = task_cells(spec, study.get_trials())[0]
        (key,) = [k for k in cells if str(dict(k)["model.feature_map.init_args.p"]) == "4"]
        return cells[key].partial

    assert not p4_partial()  # every point of p = 4 has run
    widened = {**spec.points()[-1], "model.lr": 1e-2}  # p = 4, an lr --widen added
    study.enqueue_trial(widened, skip_if_exists=False)
    assert p4_partial()
    table = rows(spec, study.get_trials())
    for row in table:  # the small setting (the spec's first) holds another state size
        if row["hparams"]["setting"] == S:
            row["hparams"] = {**row["hparams"], "state_size": 999}
    large_first = [r for r in table if r["hparams"]["setting"] == L] + \
        [r for r in table if r["hparams"]["setting"] == S]
    merged = task_rows(spec, large_first)
    assert [r["hparams"]["state_size"] for r in merged] == [999, 999]


def test_a_settings_flagged_runs_carry_to_the_task_row_and_the_suite_cell(tmp_path):
    """p = 2: a collapsed run at the large setting's best lr (3e-3) counts, one at the small
    setting's other lr (3e-3) does not; a diverged run at the small one's best lr counts (and
    has not converged)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = write_spec(tmp_path, "t_copy")
    record(url, path, RUNS, attrs={(2, 0, 3e-3, L): {"collapsed_at": 500},
                                   (2, 0, 3e-3, S): {"collapsed_at": 500},
                                   (2, 1, 1e-3, S): {"diverged": "loss is nan"}})
    spec = load_spec(path)
    merged = task_rows(spec, rows(spec, optuna.load_study(study_name="t_copy",
                                                          storage=url).get_trials()))
    p2 = next(r for r in merged if r["hparams"]["p"] == 2)
    assert (p2["collapsed"], p2["diverged"], p2["seeds"]) == (1, 1, 2)
    assert main(["suite", str(path), "--storage", url, "--out", str(tmp_path / "s")]) == 0
    with (tmp_path / "s" / "table.csv").open() as fh:
        table = {r["method"]: r for r in csv.DictReader(fh)}
    assert table["LLoPS p=2 m=64 t=1"]["t_copy_flags"] == \
        "1 of 2 seeds; 1 diverged; 1 collapsed; 1 of 1 not converged; best lr at grid edge"
