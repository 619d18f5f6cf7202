"""A finished run of another study stands for an equal grid point (``reuse:``)."""

import shutil

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState
from paths import SMOKE, config
from test_sweeps import sweep, write_spec

from sweeps.command import trial_args
from sweeps.reuse import _parse_only_cli, experiment, same_experiments
from sweeps.spec import load_spec


def test_the_same_experiment_written_two_ways_is_equal():
    via_p4 = experiment(["--config", config("p4.yaml"), *SMOKE,
                         "--model.feature_map.init_args.p=2",
                         "--trainer.logger.init_args.name=a"])
    via_p2 = experiment(["--config", config("p2.yaml"), *SMOKE,
                         "--trainer.logger.init_args.name=b", "--trainer.enable_progress_bar=false"])
    assert via_p4 == via_p2
    assert via_p2 != experiment(["--config", config("p2.yaml"), *SMOKE,
                                 "--model.lr=0.01"])
    assert via_p2 != experiment(["--config", config("p2.yaml"), *SMOKE,
                                 "--seed_everything=1"])


def test_an_unset_precision_is_the_same_experiment_as_32_true():
    unset = experiment(["--config", config("p2.yaml"), *SMOKE])
    for same in ("32-true", "32"):
        assert unset == experiment(["--config", config("p2.yaml"), *SMOKE,
                                    f"--trainer.precision={same}"])
    assert unset != experiment(["--config", config("p2.yaml"), *SMOKE,
                                "--trainer.precision=bf16-mixed"])


def test_a_study_reuses_the_equal_runs_of_another(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = write_spec(tmp_path, "first", {"model.feature_map.init_args.p": [2],
                                           "seed_everything": [0]})
    assert sweep("run", str(first), "--storage", url, cwd=tmp_path).returncode == 0
    shutil.rmtree(tmp_path / "runs")  # the trial's recorded config stands in for its folder
    second = write_spec(tmp_path, "second", {"config": [config("p2.yaml")],
                                             "seed_everything": [0, 1]},
                        configs=[], reuse=["first"])
    out = sweep("run", str(second), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reused 1 finished run(s): first#0" in out.stdout
    done = optuna.load_study(study_name="first", storage=url).trials[0]
    trials = optuna.load_study(study_name="second", storage=url).trials
    reused = [t for t in trials if t.user_attrs.get("reused_from")]
    assert [(t.params["seed_everything"], t.user_attrs["reused_from"], t.value)
            for t in reused] == [(0, "first#0", done.value)]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials) and len(trials) == 2


def test_reuse_of_a_study_that_never_ran_is_a_note_and_trains_everything(tmp_path):
    spec = write_spec(tmp_path, "lonely", {"seed_everything": [0]}, reuse=["nosuch"])
    out = sweep("run", str(spec), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
                cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "note: reuse: study nosuch has not run in this storage" in out.stderr
    assert "complete 1" in out.stdout


def test_a_pruned_run_is_reused_as_pruned_with_its_rungs_only_where_the_study_prunes(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = write_spec(tmp_path, "first", {"model.feature_map.init_args.p": [2],
                                           "seed_everything": [0]})
    assert sweep("run", str(first), "--storage", url, cwd=tmp_path).returncode == 0
    done = optuna.load_study(study_name="first", storage=url).trials[0]
    stopped = optuna.create_study(study_name="stopped", storage=url, direction="maximize")
    stopped.set_user_attr("metric", "val/acc")  # as sweeps.study.make_study records it
    stopped.add_trial(optuna.trial.create_trial(  # the same run, as a pruner had stopped it
        state=TrialState.PRUNED, params=done.params, distributions=done.distributions,
        intermediate_values={3: 0.25, 6: 0.5}, user_attrs=done.user_attrs,
        system_attrs={"completed_rung_0": 0.5, "fixed_params": done.params}))
    grid = {"config": [config("p2.yaml")], "seed_everything": [0]}
    pruning = write_spec(tmp_path, "pruning", grid, configs=[], reuse=["stopped"],
                         pruner={"type": "halving", "min_resource": 3})
    out = sweep("run", str(pruning), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reused 1 finished run(s): stopped#0" in out.stdout
    (t,) = optuna.load_study(study_name="pruning", storage=url).trials
    assert t.state == TrialState.PRUNED and t.value is None
    assert t.intermediate_values == {3: 0.25, 6: 0.5}
    assert t.system_attrs["completed_rung_0"] == 0.5
    plain = write_spec(tmp_path, "plain", grid, configs=[], reuse=["stopped"])
    out = sweep("run", str(plain), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0 and "reused" not in out.stdout, out.stdout
    (t,) = optuna.load_study(study_name="plain", storage=url).trials
    assert t.state == TrialState.COMPLETE and not t.user_attrs.get("reused_from")


def test_a_queued_point_another_study_has_finished_since_is_reused_when_reached(tmp_path):
    """Two studies that reuse each other: the one queued first finds the shared point finished
    by the other when its worker reaches it, and records that run instead of training it."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    grid = {"model.feature_map.init_args.p": [2]}
    late = write_spec(tmp_path, "late", {**grid, "seed_everything": [0, 1]}, reuse=["early"])
    early = write_spec(tmp_path, "early", {**grid, "seed_everything": [1]}, reuse=["late"])
    out = sweep("run", str(late), "--storage", url, "--trials", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # seed 0 trained, seed 1 queued
    assert sweep("run", str(early), "--storage", url, cwd=tmp_path).returncode == 0
    out = sweep("run", str(late), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reused early#0 (complete), not trained" in out.stdout
    (done,) = optuna.load_study(study_name="early", storage=url).trials
    trials = {t.params["seed_everything"]: t
              for t in optuna.load_study(study_name="late", storage=url).trials}
    assert trials[1].state == TrialState.COMPLETE and trials[1].value == done.value
    assert trials[1].user_attrs["reused_from"] == "early#0"
    assert trials[1].intermediate_values == done.intermediate_values
    assert not trials[0].user_attrs.get("reused_from")
    assert sorted(p.name for p in (tmp_path / "runs" / "late").iterdir()
                  if p.is_dir()) == [trials[0].user_attrs["run_name"]]


def test_a_reused_run_is_valued_by_the_reusing_studys_objective(tmp_path):
    """A study judged by zoology's metric reuses a run of one judged by val/acc at the run's
    recorded zoology value, without its val/acc curve and rung values; a pruned run of that
    study, whose curve is all it has, is trained instead."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = write_spec(tmp_path, "first", {"model.feature_map.init_args.p": [2],
                                           "seed_everything": [0]})
    assert sweep("run", str(first), "--storage", url, cwd=tmp_path).returncode == 0
    assert optuna.load_study(study_name="first", storage=url).user_attrs["metric"] == "val/acc"
    done = optuna.load_study(study_name="first", storage=url).trials[0]
    assert done.user_attrs["example_acc"] not in (None, done.value)  # the metrics differ
    old = optuna.create_study(study_name="old", storage=url, direction="maximize")
    old.add_trial(optuna.trial.create_trial(  # the run with a curve and a rung, in val/acc
        state=TrialState.COMPLETE, value=done.value, params=done.params,
        distributions=done.distributions, intermediate_values={3: done.value},
        user_attrs=done.user_attrs, system_attrs={"completed_rung_0": done.value,
                                                  "fixed_params": done.params}))
    seed1 = {**done.user_attrs,
             "config": done.user_attrs["config"].replace("seed_everything: 0",
                                                         "seed_everything: 1")}
    old.set_user_attr("metric", "val/acc")
    old.add_trial(optuna.trial.create_trial(
        state=TrialState.PRUNED, params={**done.params, "seed_everything": 1},
        distributions={**done.distributions, "seed_everything": IntDistribution(1, 1)},
        intermediate_values={3: 0.5}, user_attrs=seed1,
        system_attrs={"fixed_params": {**done.params, "seed_everything": 1}}))
    zoo = write_spec(tmp_path, "zoo", {"config": [config("p2.yaml")], "seed_everything": [0, 1]},
                     configs=[], reuse=["old"], objective={"metric": "val/example_acc"},
                     pruner={"type": "halving", "min_resource": 3})
    out = sweep("run", str(zoo), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "reused 1 finished run(s): old#0" in out.stdout
    trials = {t.params["seed_everything"]: t
              for t in optuna.load_study(study_name="zoo", storage=url).trials}
    reused = trials[0]
    assert reused.user_attrs["reused_from"] == "old#0"
    assert reused.value == done.user_attrs["example_acc"]
    assert reused.intermediate_values == {}
    assert not any(k.startswith("completed_rung_") for k in reused.system_attrs)
    assert not trials[1].user_attrs.get("reused_from")  # trained: its curve is val/acc's


def recorded_config(spec, point):
    """The ``config`` user attr a worker records for ``point`` of ``spec``."""
    cli = _parse_only_cli(trial_args(spec, point, "runs", "run"))
    return cli.parser.dump(cli.config, skip_none=False)


def add_finished(study, spec, point, state=TrialState.COMPLETE):
    """A finished run of ``point`` (a pruned one after one validation, at its rung)."""
    pruned = state == TrialState.PRUNED
    study.add_trial(optuna.trial.create_trial(
        state=state, value=None if pruned else 0.5, params=point,
        distributions={k: FloatDistribution(v, v) if isinstance(v, float)
                       else IntDistribution(v, v) for k, v in point.items()},
        intermediate_values={3: 0.25} if pruned else {},
        user_attrs={"config": recorded_config(spec, point), "val_acc": 0.5},
        system_attrs={"fixed_params": point, **({"completed_rung_0": 0.25} if pruned else {})}))


def test_a_pruned_run_is_not_reused_at_an_lr_this_studys_pruner_never_stops(tmp_path):
    """An lr beyond the spec's ``lr:`` (``--widen``'s) runs its whole budget here
    (``BracketPruner.widened``): a run another study's pruner stopped there is not its run."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = load_spec(write_spec(tmp_path, "pruning", {"seed_everything": [0]}, reuse=["stopped"],
                                pruner={"type": "halving", "min_resource": 3}))
    assert spec.lr == [3e-3]
    stopped = optuna.create_study(study_name="stopped", storage=url, direction="maximize")
    stopped.set_user_attr("metric", "val/acc")
    points = [{"seed_everything": 0, "model.lr": lr} for lr in (3e-3, 1e-2)]
    for point in points:
        add_finished(stopped, spec, point, TrialState.PRUNED)
    assert list(same_experiments(spec, points, url)) == [0]


def test_a_study_deleted_and_run_again_is_read_afresh(tmp_path):
    """Trial ids of a deleted study are given again (SQLite): a worker's cache of saved
    configurations must not take a new run for the one the id named before."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = load_spec(write_spec(tmp_path, "later", {"seed_everything": [0, 1]}, reuse=["first"]))
    points = spec.points()
    first = optuna.create_study(study_name="first", storage=url, direction="maximize")
    first.set_user_attr("metric", "val/acc")
    add_finished(first, spec, points[0])
    assert list(same_experiments(spec, points, url)) == [0]
    optuna.delete_study(study_name="first", storage=url)
    first = optuna.create_study(study_name="first", storage=url, direction="maximize")
    first.set_user_attr("metric", "val/acc")
    add_finished(first, spec, points[1])
    assert list(same_experiments(spec, points, url)) == [1]
