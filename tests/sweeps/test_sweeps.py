import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from paths import ROOT, config

from sweeps.spec import SpecError, _check_plots, load_spec

FAST = ["--trainer.max_steps=6", "--trainer.val_check_interval=3"]


def write_spec(tmp: Path, study: str, grid: dict, **extra) -> Path:
    spec = {"study": study, "configs": [config("p4.yaml")], "profile": "smoke", "size": "tiny",
            "grid": grid, "lr": [3.0e-3], "args": FAST, **extra}
    path = tmp / f"{study}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sweep(*args, cwd: Path, timeout: int = 300, check: bool = False):
    return subprocess.run([sys.executable, "-m", "sweeps", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=check)


def completed_points(study: str, url: str) -> Counter:
    trials = optuna.load_study(study_name=study, storage=url).get_trials()
    return Counter(tuple(sorted(t.params.items())) for t in trials
                   if t.state == optuna.trial.TrialState.COMPLETE)


GRID4 = {"model.feature_map.init_args.p": [2, 3], "seed_everything": [0, 1]}


def test_grid_aliases_stand_for_full_keys(tmp_path):
    spec = load_spec(write_spec(tmp_path, "alias", {"p": [2, 4], "seed": [0], "rank,m": [[1, 8]],
                                                   "d_model": [16]}, lr=[]), size="tiny")
    assert spec.points()[0] == {"model.feature_map.init_args.p": 2, "seed_everything": 0,
                                "model.feature_map.init_args.rank": 1,
                                "model.feature_map.init_args.m": 8, "model.d_model": 16}
    assert spec.size_path.endswith("configs/sizes/tiny.yaml")
    with_lr = load_spec(write_spec(tmp_path, "alias_lr", {"lr": [1e-3, 3e-3]}, lr=[]))
    assert [pt["model.lr"] for pt in with_lr.points()] == [1e-3, 3e-3]
    for grid, needle in (({"p": [2], "model.feature_map.init_args.p": [4]}, "sets "
                          "model.feature_map.init_args.p twice"),
                         ({"lr": [1e-3]}, "both in the grid and the lr: sub-grid")):
        with pytest.raises(SpecError, match=needle):
            load_spec(write_spec(tmp_path, "bad", grid))
    with pytest.raises(SpecError, match="unknown size 'huge': no configs/sizes/huge.yaml"):
        load_spec(write_spec(tmp_path, "alias", {"p": [2]}), size="huge")


def test_points_cartesian_and_zipped():
    spec = load_spec(ROOT / "sweeps" / "rank.yaml", "paper")
    points = spec.points()
    assert len(points) == 3 * 7 * 3 * 4  # p × (rank, m) × seed × lr (logspace(-3, -1.5, 4))
    assert {(p["model.feature_map.init_args.rank"], p["model.feature_map.init_args.m"])
            for p in points} >= {(1, 256), (8, 256), (8, 32)}
    cpu = {(p["model.feature_map.init_args.rank"], p["model.feature_map.init_args.m"])
           for p in load_spec(ROOT / "sweeps" / "rank.yaml", "cpu").points()}
    assert (8, 32) in cpu and (8, 256) not in cpu


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml")))
@pytest.mark.parametrize("profile", ["smoke", "cpu", "paper"])
def test_shipped_specs_load(name, profile):
    assert load_spec(ROOT / "sweeps" / f"{name}.yaml", profile).points()


def test_string_grid_values_reach_the_model(tmp_path):
    from arbench.cli import build_cli
    from sweeps.command import trial_args

    spec = load_spec(ROOT / "sweeps" / "normalize.yaml", "smoke")
    point = [p for p in spec.points() if p["model.normalize"] == "signed"][0]
    args = trial_args(spec, point, str(tmp_path), "check")
    assert "--model.normalize=signed" in args
    cli = build_cli(args, run=False)
    assert cli.model.model.blocks[1].mixer.normalize == "signed"


def test_kill_and_resume_runs_every_point_exactly_once(tmp_path):
    spec = write_spec(tmp_path, "killme", GRID4)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cmd = [sys.executable, "-m", "sweeps", "run", str(spec), "--storage", url, "--heartbeat",
           "1", "--grace", "3", "--threads", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    first = None
    while time.time() < deadline and first is None:
        time.sleep(0.5)
        try:
            done = [t for t in optuna.load_study(study_name="killme", storage=url).get_trials()
                    if t.state == optuna.trial.TrialState.COMPLETE]
        except KeyError:
            continue
        first = done[0] if done else None
    assert first is not None, "no trial completed in time"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    out = sweep("run", str(spec), "--storage", url, "--heartbeat", "1", "--grace", "3",
                "--threads", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = completed_points("killme", url)
    assert len(counts) == 4 and set(counts.values()) == {1}
    trials = optuna.load_study(study_name="killme", storage=url).get_trials()
    again = [t for t in trials if t.number == first.number][0]
    assert again.state == optuna.trial.TrialState.COMPLETE
    assert again.datetime_complete == first.datetime_complete  # never rerun
    # a completed run's record carries its training loss (block means) to other machines
    assert all(t.user_attrs["loss_curve"][-1][0] == t.user_attrs["global_step"]
               for t in trials if t.state == optuna.trial.TrialState.COMPLETE)


def test_a_resumed_point_does_not_warn_that_its_checkpoint_folder_is_used(tmp_path):
    """A point whose run folder holds a last.ckpt resumes from it, without Lightning's
    "Checkpoint directory … exists and is not empty" (the folder is its own, by design). With
    a pruner on, the resume reads its checkpoint's step to replay the curve before it. The
    trial's wall time counts the run's training before the resume (the checkpoint's)."""
    import torch

    spec = write_spec(tmp_path, "again", {"model.feature_map.init_args.p": [2]},
                      pruner={"type": "halving", "min_resource": 3})
    for db in ("first", "second"):  # the second database finds the first's run folder
        out = sweep("run", str(spec), "--storage", f"sqlite:///{tmp_path / db}.sqlite",
                    "--threads", "1", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        if db == "first":  # as if the run had trained 1000 s before the stop
            [last] = (tmp_path / "runs").rglob("last.ckpt")
            state = torch.load(last, map_location="cpu", weights_only=False)
            state["callbacks"]["RunSummary"]["wall_time_s"] = 1000.0
            torch.save(state, last)
    assert "(resuming last.ckpt)" in out.stdout
    assert "exists and is not empty" not in out.stderr
    [trial] = optuna.load_study(study_name="again",
                                storage=f"sqlite:///{tmp_path / 'second'}.sqlite").trials
    assert 1000.0 < trial.user_attrs["wall_time_s"] < 1300.0


def run_two_workers(tmp_path: Path, url: str, study: str) -> None:
    """``--workers 2`` in one command, plus a second command started at the same moment (as
    on another machine): both race to queue the grid and to claim its points."""
    spec = write_spec(tmp_path, study, GRID4)
    cmd = [sys.executable, "-m", "sweeps", "run", str(spec), "--storage", url, "--threads", "1"]
    procs = [subprocess.Popen(cmd + extra, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for extra in (["--workers", "2"], [])]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    trials = optuna.load_study(study_name=study, storage=url).get_trials()
    counts = completed_points(study, url)
    assert len(counts) == 4 and set(counts.values()) == {1}
    assert len(trials) == 4  # nothing duplicated, nothing left waiting
    # each finished run prints one "[time worker] trial N name: metric value in T s" line;
    # the queueing lock's waiting line also ends in " s", so match the run lines themselves
    ran = [line for out, _ in outs for line in out.splitlines()
           if re.fullmatch(r"\[\S+ w\d+\] trial \d+ \S+: \S+ [\d.]+ in \d+ s", line)]
    assert len(ran) == 4, ran


def test_two_workers_split_grid_sqlite(tmp_path):
    run_two_workers(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", "twoworkers")
    spec = write_spec(tmp_path, "twoworkers", GRID4)
    out = sweep("report", str(spec), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
                "--out", str(tmp_path / "results"), cwd=tmp_path, check=True)
    table = (tmp_path / "results/twoworkers/table.md").read_text()
    assert table.count("| LLoPS p=") == 2 and "± " in table
    assert (tmp_path / "results/twoworkers/table.csv").exists()
    assert list((tmp_path / "results/twoworkers").glob("*.png")), out.stdout
    runs = (tmp_path / "results/twoworkers/runs.csv").read_text().splitlines()
    assert len(runs) == 5 and "converged" in runs[0] and "collapsed_at" in runs[0]
    assert all(",complete," in line for line in runs[1:])


@pytest.mark.skipif(not os.environ.get("ARBENCH_TEST_PG_URL"),
                    reason="no PostgreSQL server given (set ARBENCH_TEST_PG_URL; .ci/run does)")
def test_two_workers_split_grid_postgresql(tmp_path):
    study = f"pg{int(time.time() * 1000)}"
    run_two_workers(tmp_path, os.environ["ARBENCH_TEST_PG_URL"], study)


@pytest.mark.parametrize("change,needle", [
    ({"bogus": 1}, "unknown key(s) in bad.yaml: bogus"),
    ({"grid": {}}, "grid must be a non-empty mapping"),
    ({"grid": {"model.feature_map.init_args.p": []}}, "must be a non-empty list"),
    ({"grid": {"model.feature_map.init_args.p": [0]}}, "p must be an integer >= 1, got 0"),
    ({"storage": "postgresql://nobody@127.0.0.1:1/none"}, "cannot open storage"),
    ({"pruner": "sometimes"}, "pruner must be one of"),
    ({"pruner": {"type": "median", "patience": 3}}, "pruner median: "),
    ({"plots": [{"series": "p"}]}, "plots[0] must be a mapping with an x: key"),
    ({"plots": [{"x": "rank", "colour": "red"}]}, "plots[0]: unknown key(s) colour"),
    ({"description": ["a", "list"]}, "description must be text"),
])
def test_bad_spec_one_clear_line(tmp_path, change, needle):
    spec = write_spec(tmp_path, "bad", GRID4)
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), **change}))
    storage = [] if "storage" in change else ["--storage", f"sqlite:///{tmp_path / 'db.sqlite'}"]
    out = sweep("run", str(spec), *storage, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.startswith("error:")]) == 1


def test_spec_error_unknown_profile(tmp_path):
    spec = write_spec(tmp_path, "x", GRID4)
    with pytest.raises(SpecError, match="unknown profile 'huge'"):
        load_spec(spec, "huge")


def test_pruned_trials_are_recorded_and_the_sweep_goes_on(tmp_path):
    # a threshold no accuracy can reach: every trial is pruned at its first validation (step 3)
    spec = write_spec(tmp_path, "prune", {"seed_everything": [0, 1]},
                      pruner={"type": "threshold", "lower": 1.01})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(spec), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pruned 2" in out.stdout, out.stdout
    trials = optuna.load_study(study_name="prune", storage=url).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [3] for t in trials)
    assert all(0 <= v <= 1 for t in trials for v in t.intermediate_values.values())
    for t in trials:  # what the run had done is kept: curve, step, wall time, hparams
        assert t.user_attrs["val_curve"] == [[3, t.intermediate_values[3]]]
        assert t.user_attrs["global_step"] == 3 and t.user_attrs["wall_time_s"] > 0
        assert t.user_attrs["hparams"]["feature_map"] == "LLoPS"
        assert [s for s, _ in t.user_attrs["loss_curve"]] == [3]  # the loss travels too
    out = sweep("report", str(spec), "--storage", url, "--out", str(tmp_path / "res"),
                cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    table = (tmp_path / "res" / "prune" / "table.md").read_text()
    assert "(2) |" in table and "2 pruned" in table, table
    assert not (tmp_path / "res" / "prune" / "halving.md").exists()  # no replay of a live pruner


def test_median_pruner_reports_every_validation(tmp_path):
    spec = write_spec(tmp_path, "median", {"seed_everything": [0]}, pruner="median")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(spec), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (trial,) = optuna.load_study(study_name="median", storage=url).get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE  # a lone trial is never pruned
    assert sorted(trial.intermediate_values) == [3, 6]  # both validations of the epoch


def test_plot_where_selects_rows_by_value_and_by_product(tmp_path, monkeypatch):
    from sweeps.report.plots import write_plot

    def row(m, rank, acc):
        return {"hparams": {"m": m, "rank": rank, "p": 2}, "mean": acc, "std": 0.0}

    table = [row(256, 1, 0.5), row(256, 2, 0.6), row(128, 2, 0.7), row(64, 4, 0.8)]
    seen = {}

    def capture(name, xs, ys):
        seen[name] = list(zip(xs, ys))

    import matplotlib.axes

    orig = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, *a, **k):
        capture(k.get("label"), x, y)
        return orig(self, x, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    write_plot(table, {"x": "rank", "series": "p", "where": {"m": 256}, "name": "a"},
                      tmp_path)
    assert seen.pop("p=2") == [(1.0, 50.0), (2.0, 60.0)]
    write_plot(table, {"x": "rank", "series": "p", "where": {"m*rank": 256}, "name": "b"},
                      tmp_path)
    assert seen.pop("p=2") == [(1.0, 50.0), (2.0, 70.0), (4.0, 80.0)]  # 256·1, 128·2, 64·4
    write_plot(table, {"x": "rank", "series": "p", "where": {"m": [128, 64]}, "name": "c"},
                      tmp_path)
    assert seen.pop("p=2") == [(2.0, 70.0), (4.0, 80.0)]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.png", "b.png", "c.png"]


def test_marked_plot_keeps_methods_that_share_an_x_apart(tmp_path, monkeypatch):
    """``marker_by: method``: one unjoined point per row, a colour per series value and a shape
    per method, nudged sideways per series; an unknown ``marker_by`` is refused in one line."""
    import matplotlib.axes

    from sweeps.report.plots import write_plot

    def row(fm, p, mixers, size, acc):
        return {"hparams": {"feature_map": fm, "p": p, "m": 256, "rank": 1, "mixers": mixers,
                            "state_size": size}, "mean": acc, "std": 0.01}

    table = [row("LLoPS", 2, "conv,linear", 100, 0.9), row("LLoPS", 4, "conv,linear", 100, 0.8),
             row("LLoPS", 2, "conv,delta", 100, 0.7)]
    drawn = []
    orig = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, *a, **k):
        drawn.append((k["label"], k["marker"], k["color"], x[0], y[0], k["linestyle"]))
        return orig(self, x, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    path = write_plot(table, {"x": "state_size", "series": "mixers",
                                     "marker_by": "method", "xscale": "log"}, tmp_path)
    assert path.name == "acc_vs_state_size.png" and path.stat().st_size > 0
    by_label = {d[0]: d[1:] for d in drawn}
    p2_lin = by_label["mixers=conv,linear · LLoPS p=2 m=256 t=1"]
    p4_lin = by_label["mixers=conv,linear · LLoPS p=4 m=256 t=1"]
    p2_delta = by_label["mixers=conv,delta · LLoPS p=2 m=256 t=1"]
    assert len(drawn) == 3 and all(d[-1] == "none" for d in drawn)
    assert p2_lin[0] != p4_lin[0] and p2_lin[0] == p2_delta[0]  # a shape per method
    assert p2_lin[1] == p4_lin[1] != p2_delta[1]  # a colour per rule
    assert p2_lin[2] == p4_lin[2] != p2_delta[2]  # rules nudged apart, methods of one rule not
    assert (p2_lin[3], p4_lin[3], p2_delta[3]) == pytest.approx((90.0, 80.0, 70.0))
    with pytest.raises(SpecError, match=r"plots\[0\]\.marker_by must be method"):
        _check_plots([{"x": "state_size", "marker_by": "p"}])


def test_report_flags_and_one_row_per_run(tmp_path):
    """Best lr by mean over seeds, n / n_lrs / converged share / collapses / lr at an edge."""
    import csv
    from types import SimpleNamespace

    from optuna.distributions import CategoricalDistribution

    from sweeps.report import study_trials
    from sweeps.report.rows import rows
    from sweeps.report.runs import write_runs
    from sweeps.report.table import flags, write_table

    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="flags", storage=storage, direction="maximize")
    lrs, seeds = [3e-4, 1e-3, 3e-3], [0, 1, 2]
    dists = {"model.lr": CategoricalDistribution(lrs), "seed_everything":
             CategoricalDistribution(seeds), "p": CategoricalDistribution([4])}
    acc = {3e-4: 0.5, 1e-3: 0.9, 3e-3: 0.7}
    for lr in lrs:
        for seed in seeds:
            attrs = {"converged": not (lr == 1e-3 and seed == 2), "global_step": 1000,
                     "collapsed_at": 520 if (lr == 1e-3 and seed == 1) else None,
                     "hparams": {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1},
                     "val_acc": acc[lr], "last_val_acc": acc[lr] - 0.01,
                     "device": "cpu: AMD EPYC" if lr == 3e-3 else "cpu: Intel(R) Xeon(R) Processor"}
            study.add_trial(optuna.trial.create_trial(
                params={"model.lr": lr, "seed_everything": seed, "p": 4}, distributions=dists,
                value=acc[lr] + 0.01 * seed, user_attrs=attrs))
    spec = SimpleNamespace(study="flags", direction="maximize", metric="val/acc", profile="cpu",
                           plots=[], description=None)
    (row,) = rows(spec, study_trials(spec, storage))
    assert row["best_lr"] == 1e-3 and row["n"] == 3 and row["n_lrs"] == 3
    assert row["converged"] == 2 / 3 and row["collapsed"] == 1 and not row["lr_at_edge"]
    assert flags(row) == "1 collapsed; 1 of 3 not converged"
    write_table(spec, [row], tmp_path)
    table = next(csv.DictReader((tmp_path / "table.csv").open()))
    assert (table["n"], table["n_lrs"], table["collapsed"]) == ("3", "3", "1")
    assert float(table["converged"]) == 2 / 3
    # runs on two machines: the table says so, and which machines each row's runs used
    text = (tmp_path / "table.md").read_text()
    assert "Runs trained on more than one machine" in text
    assert text.splitlines()[-1].endswith("| AMD EPYC, Intel Xeon Processor |")
    write_runs(spec, study_trials(spec, storage), tmp_path)
    runs = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert len(runs) == 9
    assert {"p", "lr", "seed", "val_acc", "last_val_acc", "steps", "converged", "collapsed_at",
            "wall_time_s", "state", "device"} <= set(runs[0])
    assert sum(r["device"] == "cpu: AMD EPYC" for r in runs) == 3
    assert sum(r["collapsed_at"] == "520" for r in runs) == 1
    edge = dict(row, best_lr=3e-3, lr_at_edge=True, collapsed=0, not_converged=0)
    assert flags(edge) == "best lr at grid edge"


def test_paper_gpu_spec_runs_at_smoke_size_and_names_the_device(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = str(ROOT / "sweeps/paper_gpu.yaml")
    sweep("run", spec, "--profile", "smoke", "--size", "tiny", "--storage", url, "--runs",
          str(tmp_path / "runs"), cwd=tmp_path, check=True)
    sweep("report", spec, "--profile", "smoke", "--storage", url, "--out",
          str(tmp_path / "results"), cwd=tmp_path, check=True)
    table = (tmp_path / "results/paper_gpu/table.md").read_text()
    assert "Device: cpu: " in table and table.count("| BASED r=16") == 1
    assert "\nThe paper profile on one GPU in under 10 minutes - BASED r=16" in table  # description


def test_claims_are_checked_seed_by_seed():
    from sweeps.report.table import claim_rows, claims_text

    def row(p, values):
        return {"hparams": {"feature_map": "LLoPS", "p": p}, "seed_values": dict(enumerate(values))}

    table = [row(2, [0.80, 0.85, 0.90]), row(4, [0.90, 0.80, 0.95]), row(6, [0.5, 0.6])]
    claims = [{"name": "p=4 > p=2", "better": {"p": 4}, "worse": {"p": 2}},
              {"name": "p=4 > p=6", "better": {"p": 4}, "worse": {"p": 6}},
              {"name": "LLoPS > BASED", "better": {"p": 4}, "worse": {"feature_map": "Based"}}]
    got = claim_rows(table, claims)
    assert (got[0]["k"], got[0]["n"]) == (2, 3)
    assert got[0]["gap_mean"] == pytest.approx(0.1 / 3)
    assert (got[1]["k"], got[1]["n"]) == (2, 2)  # only the seeds both rows have
    assert got[2]["status"] == "0 rows match worse {'feature_map': 'Based'}"
    text = claims_text(got)
    assert text[0] == "- p=4 > p=2: holds in 2 of 3 seeds, mean gap +3.3 ± 7.6 points"
    assert text[1] == "- p=4 > p=6: holds in 2 of 2 seeds, mean gap +30.0 ± 14.1 points"
    assert text[2].startswith("- LLoPS > BASED: not checked (0 rows match")


def test_a_claim_short_of_the_studys_seeds_says_so():
    """A seed with no result on one side (a failed run) leaves the claim's n below the
    study's seed count: the line says how many, never a bare "2 of 2"."""
    from sweeps.report.table import claim_rows, claims_text

    def row(p, values):
        return {"hparams": {"p": p}, "seed_values": dict(enumerate(values)), "seeds": 3}

    claims = [{"name": "p=4 > p=2", "better": {"p": 4}, "worse": {"p": 2}}]
    short, = claim_rows([row(2, [0.80, 0.85]), row(4, [0.90, 0.95, 0.99])], claims)
    assert (short["k"], short["n"], short["seeds"]) == (2, 2, 3)
    assert claims_text([short])[0] == ("- p=4 > p=2: holds in 2 of 2 seeds, mean gap +10.0 ± "
                                       "0.0 points (only 2 of the study's 3 seeds have a "
                                       "result on both sides)")
    whole, = claim_rows([row(2, [0.80, 0.85, 0.9]), row(4, [0.90, 0.95, 0.99])], claims)
    assert "only" not in claims_text([whole])[0]


def test_a_parity_claim_compares_the_means_with_the_reference_spread():
    from sweeps.report.table import claim_rows, claims_text

    def row(precision, values):
        return {"hparams": {"p": 4, "precision": precision}, "seed_values": dict(enumerate(values))}

    fp32 = row("32-true", [0.90, 0.95, 1.00])  # sample std 5 points
    claims = [{"name": "bf16 = fp32", "better": {"precision": "bf16-mixed"},
               "worse": {"precision": "32-true"}, "parity": 1.0}]
    inside, = claim_rows([row("bf16-mixed", [0.86, 0.91, 0.96]), fp32], claims)
    assert inside["parity"] and inside["mean_gap"] == pytest.approx(-0.04)
    assert inside["tolerance"] == pytest.approx(0.05)
    assert claims_text([inside])[0].endswith(
        "; parity holds: means differ by -4.0 points, tolerance 5.0 (the second side's seed std "
        "or the claim's points)")
    tight = row("32-true", [0.950, 0.951, 0.952])  # std 0.1 points: the claim's 1 point counts
    near, far = (claim_rows([row("bf16-mixed", v), tight], claims)[0]
                 for v in ([0.94, 0.945, 0.94], [0.90, 0.92, 0.91]))
    assert near["parity"] and near["tolerance"] == pytest.approx(0.01)
    assert not far["parity"] and "parity fails" in claims_text([far])[0]
    without = {k: v for k, v in claims[0].items() if k != "parity"}
    plain, = claim_rows([row("bf16-mixed", [0.9]), fp32], [without])
    assert "parity" not in plain and "parity" not in claims_text([plain])[0]


def test_claims_select_rows_by_their_diagnosis_switch():
    """``variant: baseline`` picks the row without switches, ``variant: qk-norm`` the row whose
    label names that switch (and only it), at the same p."""
    from sweeps.report.table import claim_rows

    base = {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1, "weight_decay": 0.1,
            "feature_map_weight_decay": 0.1, "init": "variance"}
    table = [{"hparams": base, "seed_values": {0: 0.90, 1: 0.95}},
             {"hparams": {**base, "qk_norm": True}, "seed_values": {0: 0.99, 1: 0.93}},
             {"hparams": {**base, "qk_norm": True, "affine": True}, "seed_values": {0: 0.5}},
             {"hparams": {**base, "feature_map_weight_decay": 0.0}, "seed_values": {0: 0.91}},
             {"hparams": {**base, "p": 6}, "seed_values": {0: 0.70}}]
    claims = [{"name": "qk", "better": {"p": 4, "variant": "qk-norm"},
               "worse": {"p": 4, "variant": "baseline"}},
              {"name": "wd", "better": {"p": 4, "variant": "feature-map wd=0"},
               "worse": {"p": 4, "variant": "baseline"}},
              {"name": "none", "better": {"p": 6, "variant": "φ²"},
               "worse": {"p": 6, "variant": "baseline"}}]
    qk, wd, none = claim_rows(table, claims)
    assert (qk["k"], qk["n"]) == (1, 2) and qk["gap_mean"] == pytest.approx(0.035)
    assert (wd["k"], wd["n"]) == (1, 1) and wd["gap_mean"] == pytest.approx(0.01)
    assert none["status"] == "0 rows match better {'p': 6, 'variant': 'φ²'}"


def test_labels_name_the_diagnosis_switches():
    from sweeps.report.labels import label

    base = {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1, "weight_decay": 0.1,
            "feature_map_weight_decay": 0.1, "init": "variance"}
    assert label(base) == "LLoPS p=4 m=256 t=1"
    assert label({**base, "qk_norm": True, "affine": True}) == "LLoPS p=4 m=256 t=1 qk-norm affine"
    assert label({**base, "square": True, "normalize": "abs"}) == \
        "LLoPS p=4 m=256 t=1 denominator=abs φ²"
    assert label({**base, "init": "tau=1", "feature_map_weight_decay": 0.0}) == \
        "LLoPS p=4 m=256 t=1 init tau=1 feature-map wd=0"
    assert label({**base, "mixers": "conv,gated_delta"}) == "LLoPS p=4 m=256 t=1 [gated_delta]"
    assert label({**base, "mixers": "conv,linear"}) == "LLoPS p=4 m=256 t=1"
    assert label({"feature_map": "EluPlusOne", "p": None, "m": 128}) == "EluPlusOne m=128"


def test_trial_names_are_plain_folder_names():
    from sweeps.names import trial_name

    name = trial_name({"config": "/x/configs/p4.yaml", "model.mixers": ["conv", "delta"],
                       "seed_everything": 1, "model.lr": 0.001})
    assert name == "cfgp4_lr0.001_mixersconv-delta_seed1"


def test_best_refs_pick_the_seed_run_at_the_best_lr(tmp_path):
    from optuna.distributions import CategoricalDistribution

    from sweeps.refs import RefError, best_checkpoint, resolve_refs

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with pytest.raises(RefError, match="no such study"):
        best_checkpoint("stage1", 0, url)
    study = optuna.create_study(study_name="stage1", storage=url, direction="maximize")
    dists = {"model.lr": CategoricalDistribution([1e-3, 3e-3]),
             "seed_everything": CategoricalDistribution([0, 1])}
    for lr, values in ((1e-3, (0.9, 0.8)), (3e-3, (0.95, 0.5))):  # means 0.85 and 0.725
        for seed, value in enumerate(values):
            study.add_trial(optuna.trial.create_trial(
                params={"model.lr": lr, "seed_everything": seed}, distributions=dists,
                value=value, user_attrs={"last_checkpoint": str(tmp_path / f"c_{lr}_{seed}")}))
            if seed == 0:
                (tmp_path / f"c_{lr}_{seed}").touch()
    with pytest.raises(RefError, match=r"seed-1 run, .*c_0.001_1, is not on this machine"):
        best_checkpoint("stage1", 1, url)  # e.g. a study restored from an archive
    (tmp_path / "c_0.001_1").touch()
    assert best_checkpoint("stage1", 1, url) == str(tmp_path / "c_0.001_1")  # best mean lr
    params = {"model.init_from": "best:stage1", "seed_everything": 0, "model.lr": 0.01}
    assert resolve_refs(params, url)["model.init_from"] == str(tmp_path / "c_0.001_0")
    with pytest.raises(RefError, match="no finished run with seed 7"):
        best_checkpoint("stage1", 7, url)
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING,
                                              params={"model.lr": 1e-3, "seed_everything": 0},
                                              distributions=dists))
    with pytest.raises(RefError, match="still running"):
        best_checkpoint("stage1", 0, url)


def test_claim_with_paper_gain_prints_both_gains():
    from sweeps.report.table import claim_rows, claims_text

    table = [{"hparams": {"feature_map": "LLoPS"}, "seed_values": {0: 0.9, 1: 0.8}},
             {"hparams": {"feature_map": "Based"}, "seed_values": {0: 0.8, 1: 0.8}}]
    claims = [{"name": "BASED+LLoPS > BASED+CT", "better": {"feature_map": "LLoPS"},
               "worse": {"feature_map": "Based"}, "paper_gain": "warmstart"}]
    (line,) = claims_text(claim_rows(table, claims))
    assert line == ("- BASED+LLoPS > BASED+CT: holds in 1 of 2 seeds, mean gap +5.0 ± 7.1 "
                    "points; relative gain +6.2% (the paper: +3.6% (360M), +1.8% (1B) in "
                    "average zero-shot accuracy)")


def test_learning_curves_hold_an_early_stop_and_plot(tmp_path):
    from sweeps.report.plots import mean_curve, write_plot

    steps, mean, lo, hi = mean_curve([[[250, 0.5], [500, 0.995]],
                                             [[250, 0.3], [500, 0.6], [750, 0.8]]])
    assert steps == [250, 500, 750]
    assert mean == pytest.approx([0.4, 0.7975, 0.8975])  # the early stop holds 0.995
    assert (lo[-1], hi[-1]) == (0.8, 0.995)
    row = {"hparams": {"feature_map": "LLoPS", "p": 4, "m": 256, "rank": 1}, "best_lr": 1e-3, "n": 2,
           "curves": [[[250, 0.5], [500, 0.9]], [[250, 0.4], [500, 0.7]]]}
    path = write_plot([row], {"x": "step", "name": "curves"}, tmp_path)
    assert path.name == "curves.png" and path.stat().st_size > 1000


def test_the_papers_value_stands_only_beside_the_papers_setting(tmp_path):
    from sweeps.report import study_trials
    from sweeps.report.labels import label
    from sweeps.report.rows import rows

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="ws", storage=url, direction="maximize")
    based = {"feature_map": "Based", "p": 2, "r": 16, "d_model": 128}
    for point, hp, slices in ((0, based, {"L64_N8": 0.9}),
                              (1, {**based, "init_from": "runs/x/last.ckpt"}, {"L64_N8": 0.9}),
                              (2, {**based, "d_model": 192}, {"ow_L64_N8_U4": 0.9})):
        study.add_trial(optuna.trial.create_trial(
            params={"point": point}, value=0.9, user_attrs={"hparams": hp, "slices": slices},
            distributions={"point": optuna.distributions.IntDistribution(0, 2)}))
    spec = load_spec(write_spec(tmp_path, "ws", {"seed_everything": [0]}))
    papers = {label(r["hparams"]) + f" d={r['hparams']['d_model']}": r["paper"]
              for r in rows(spec, study_trials(spec, url))}
    # another recall task (overwrite MQAR, its slices prefixed) has no paper value either
    assert papers == {"BASED r=16 d=128": 91.9, "BASED r=16 (warm start) d=128": None,
                      "BASED r=16 d=192": None}



def test_status_estimates_the_run_time_left_from_the_studys_own_runs(tmp_path):
    from optuna.trial import TrialState, create_trial

    from sweeps.status import run_time_left, status_lines

    def run(state, seconds=None, reused=False):
        attrs = {} if seconds is None else {"wall_time_s": seconds}
        if reused:
            attrs["reused_from"] = "other#0"
        value = 0.5 if state == TrialState.COMPLETE else None
        return create_trial(state=state, value=value, user_attrs=attrs)

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="eta", storage=url, direction="maximize")
    for t in [run(TrialState.COMPLETE, 100.0), run(TrialState.PRUNED, 50.0),
              run(TrialState.COMPLETE, 300.0), run(TrialState.COMPLETE, 9000.0, reused=True)]:
        study.add_trial(t)
    assert run_time_left(study.get_trials()) == ""  # nothing queued
    for _ in range(36):
        study.enqueue_trial({})
    line = status_lines(optuna.storages.RDBStorage(url))[0]
    assert line.startswith("eta ") and "complete 3  running 0  waiting 36  fail 0  pruned 1" in line
    assert line.endswith("~1.0 h of runs left (median run 100 s)")  # 36 x 100 s (reused: no nearer)
    fresh = optuna.create_study(study_name="fresh", storage=url)
    fresh.enqueue_trial({})
    assert run_time_left(fresh.get_trials()) == ""  # no finished run to time


def test_status_shows_each_running_trial_with_its_last_validation(tmp_path):
    from sweeps.status import status_lines

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="live", storage=url, direction="maximize")
    started = study.ask()
    started.set_user_attr("run_name", "p4_lr0.001_seed0")
    for step, value in ((250, 0.125), (500, 0.5)):
        started.report(value, step)
    fresh = study.ask()
    study._storage.set_trial_system_attr(fresh._trial_id, "failed_trial", 0)
    lines = status_lines(optuna.storages.RDBStorage(url))
    assert lines[0].startswith("live ") and "running 2" in lines[0]
    since = study.get_trials()[0].datetime_start.strftime("%H:%M")
    assert lines[1] == f"  running: p4_lr0.001_seed0 since {since}, step 500: 0.5000"
    assert lines[2].startswith("  running: trial 1 (a retry) since ")
    assert lines[2].endswith(", no validation yet")


def test_status_times_each_queued_run_by_its_nearest_finished_points(tmp_path):
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from sweeps.status import run_time_left

    dists = {"config": CategoricalDistribution(["a", "b"]),
             "model.mixers": CategoricalDistribution(["linear", "delta"]),
             "model.lr": CategoricalDistribution([1e-3, 3e-3])}

    def done(config, mixer, lr, seconds):
        return create_trial(state=TrialState.COMPLETE, value=0.5, distributions=dists,
                            params={"config": config, "model.mixers": mixer, "model.lr": lr},
                            user_attrs={"wall_time_s": seconds})

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(study_name="eta", storage=url, direction="maximize")
    for t in [done("a", "linear", 1e-3, 100.0), done("a", "linear", 3e-3, 120.0),
              done("a", "delta", 1e-3, 1000.0), done("b", "linear", 3e-3, 200.0)]:
        study.add_trial(t)
    study.enqueue_trial({"config": "a", "model.mixers": "delta", "model.lr": 3e-3})  # its point: 1000
    study.enqueue_trial({"config": "b", "model.mixers": "linear", "model.lr": 1e-3})  # its point: 200
    # no finished run of (b, delta): the runs sharing one value, (a, delta) and (b, linear): 600
    study.enqueue_trial({"config": "b", "model.mixers": "delta", "model.lr": 1e-3})
    assert run_time_left(study.get_trials()) == "  ~0.5 h of runs left (median run 160 s)"


def test_status_times_a_point_unlike_any_own_run_by_a_nearer_reused_run(tmp_path):
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from sweeps.status import run_time_left

    dists = {"p": CategoricalDistribution([2, 6]), "rank": CategoricalDistribution([1, 2, 4])}

    def done(p, rank, seconds, reused=False):
        attrs = {"wall_time_s": seconds, **({"reused_from": "other#0"} if reused else {})}
        return create_trial(state=TrialState.COMPLETE, value=0.5, distributions=dists,
                            params={"p": p, "rank": rank}, user_attrs=attrs)

    study = optuna.create_study(direction="maximize")
    for t in [done(2, 2, 150.0), done(6, 1, 1000.0, reused=True),
              done(2, 1, 300.0, reused=True)]:
        study.add_trial(t)
    study.enqueue_trial({"p": 6, "rank": 4})  # no own run shares a value; reused (6, 1): 1000
    study.enqueue_trial({"p": 2, "rank": 4})  # own (2, 2) and reused (2, 1) share p: own, 150
    study.enqueue_trial({"p": 2, "rank": 2})  # its own point: 150
    assert run_time_left(study.get_trials()) == "  ~0.4 h of runs left (median run 150 s)"
    only_reused = optuna.create_study(direction="maximize")
    only_reused.add_trial(done(6, 1, 1000.0, reused=True))
    only_reused.enqueue_trial({"p": 6, "rank": 2})
    assert run_time_left(only_reused.get_trials()) == \
        "  ~0.3 h of runs left (median run 1000 s)"
