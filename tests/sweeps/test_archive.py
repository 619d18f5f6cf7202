"""A storage saved to a JSON Lines archive and restored on a new machine (``sweeps.archive``)."""

import json
import shutil

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from test_loss_curves import log_losses
from test_sweeps import sweep, write_spec

from sweeps.archive import restore, save

DISTS = {"model.lr": FloatDistribution(3e-3, 3e-3), "seed_everything": IntDistribution(0, 2)}


def a_study(url: str, name: str = "s") -> optuna.Study:
    """A study with a trial in every state, and a queueing lock beside it."""
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    study.set_user_attr("profile", "cpu")
    point = {"model.lr": 3e-3, "seed_everything": 0}
    for state, value, curve in ((TrialState.COMPLETE, 0.75, {250: 0.5, 500: 0.75}),
                                (TrialState.PRUNED, None, {250: 0.25}),
                                (TrialState.FAIL, None, {})):
        study.add_trial(create_trial(state=state, value=value, params=point, distributions=DISTS,
                                     user_attrs={"val_curve": [[250, 0.5]], "wall_time_s": 9.5},
                                     system_attrs={"fixed_params": point},
                                     intermediate_values=curve))
    running = study.ask()  # a worker's trial in flight, past the pruner's first rung
    running.set_user_attr("run_name", "lr0.003_seed1")
    running.storage.set_trial_system_attr(running._trial_id, "completed_rung_0", 0.5)
    study.enqueue_trial({"model.lr": 3e-3, "seed_everything": 2})
    optuna.create_study(study_name="_arbench_lock::s", storage=url)
    return study


def test_save_and_restore_keep_every_trial_and_queue_the_unfinished_again(tmp_path):
    before = a_study(f"sqlite:///{tmp_path / 'a.db'}")
    archive = tmp_path / "archive.jsonl"
    assert save(f"sqlite:///{tmp_path / 'a.db'}", archive) == {"s": 5}
    lines = [json.loads(line) for line in archive.read_text().splitlines()]
    assert [r.get("number") for r in lines] == [None, 0, 1, 2, 3, 4]  # no lock study

    url = f"sqlite:///{tmp_path / 'b.db'}"
    assert restore(archive, url) == ({"s": 5}, [])
    after = optuna.load_study(study_name="s", storage=url)
    assert after.user_attrs == {"profile": "cpu"} and after.direction == before.direction
    old, new = before.get_trials(), after.get_trials()
    assert [t.number for t in new] == [0, 1, 2, 3, 4]
    assert [t.state for t in new] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                      TrialState.WAITING, TrialState.WAITING]
    for a, b in zip(old[:3], new[:3]):
        assert (a.value, a.params, a.distributions, a.user_attrs, a.system_attrs,
                a.intermediate_values, a.datetime_complete) == \
               (b.value, b.params, b.distributions, b.user_attrs, b.system_attrs,
                b.intermediate_values, b.datetime_complete)
    assert new[4].system_attrs["fixed_params"] == {"model.lr": 3e-3, "seed_everything": 2}
    assert new[3].user_attrs == {"run_name": "lr0.003_seed1"}
    assert old[3].system_attrs == {"completed_rung_0": 0.5}
    assert new[3].system_attrs == {}  # it trains again from step 0: judged again

    assert restore(archive, url) == ({}, ["s"])  # a study already there is left alone
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 5


def test_saving_keeps_the_archives_studies_that_the_storage_lacks(tmp_path):
    archive = tmp_path / "archive.jsonl"
    a_study(f"sqlite:///{tmp_path / 'a.db'}", "first")
    save(f"sqlite:///{tmp_path / 'a.db'}", archive)
    a_study(f"sqlite:///{tmp_path / 'b.db'}", "second")
    assert save(f"sqlite:///{tmp_path / 'b.db'}", archive) == {"second": 5}
    studies = [json.loads(line)["study"] for line in archive.read_text().splitlines()]
    assert studies == ["first"] * 6 + ["second"] * 6


def test_a_restored_sweep_resumes_on_a_new_machine_without_training_again(tmp_path):
    spec = write_spec(tmp_path, "moved", {"seed_everything": [0, 1]})
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert sweep("run", str(spec), "--storage", url, cwd=tmp_path).returncode == 0
    out = sweep("save", "results/archive.jsonl", "--storage", url, cwd=tmp_path)
    assert out.returncode == 0 and "saved moved: 2 trial(s)" in out.stdout, out.stderr
    shutil.rmtree(tmp_path / "runs")  # the new machine has neither runs/ nor the database

    url = f"sqlite:///{tmp_path / 'b.db'}"
    out = sweep("restore", "results/archive.jsonl", "--storage", url, cwd=tmp_path)
    assert out.returncode == 0 and "restored moved: 2 trial(s)" in out.stdout, out.stderr
    out = sweep("run", str(spec), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "0 newly queued" in out.stdout and "complete 2" in out.stdout
    assert "(this process ran 0)" in out.stdout
    out = sweep("report", str(spec), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len((tmp_path / "results/moved/runs.csv").read_text().splitlines()) == 3


def test_a_file_that_is_not_an_archive_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a sweep ran here\n")
    url = f"sqlite:///{tmp_path / 'a.db'}"
    for archive, needle in (("notes.txt", "notes.txt:1 is not a sweep archive line"),
                            ("missing.jsonl", "cannot read archive missing.jsonl")):
        out = sweep("restore", archive, "--storage", url, cwd=tmp_path)
        assert out.returncode == 2 and out.stdout == ""
        assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: ")
        assert needle in out.stderr
    (tmp_path / "cut.jsonl").write_text('{"study": "s", "directions": ["maximize"]}\n'
                                        '{"study": "s", "number": 0, "state": "COMPLETE"}\n')
    out = sweep("restore", "cut.jsonl", "--storage", url, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "cut.jsonl: study s, trial 0: a complete trial needs 1 value(s); nothing was " \
        "restored" in out.stderr
    assert "s" not in optuna.get_all_study_names(url)  # nothing of it was kept
    out = sweep("save", "archive.jsonl", "--storage", f"sqlite:///{tmp_path / 'none.db'}",
                cwd=tmp_path)
    assert out.returncode == 2 and "no sweep database at" in out.stderr


def test_a_failed_trial_with_a_value_restores_without_it(tmp_path):
    # as a pruned run marked failed by hand leaves it (diagnosis trial 131): Optuna refuses to
    # add a failed trial with values, which made the whole study unrestorable
    a_study(f"sqlite:///{tmp_path / 'a.db'}")
    archive = tmp_path / "archive.jsonl"
    save(f"sqlite:///{tmp_path / 'a.db'}", archive)
    lines = [json.loads(line) for line in archive.read_text().splitlines()]
    assert lines[3]["state"] == "FAIL" and lines[3]["values"] is None
    lines[3]["values"] = [0.0457]
    archive.write_text("".join(json.dumps(r) + "\n" for r in lines))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    assert restore(archive, url) == ({"s": 5}, [])
    failed = optuna.load_study(study_name="s", storage=url).get_trials()[2]
    assert failed.state == TrialState.FAIL and failed.values is None


def test_a_run_recorded_without_its_loss_is_archived_with_its_event_files_curve(tmp_path):
    """Trials recorded before records kept the training loss take the curve their event files
    hold on the saving machine; a recorded curve is kept as it is; missing files change
    nothing."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    study = optuna.create_study(study_name="old", storage=url, direction="maximize")
    run = tmp_path / "runs" / "lr0.003_seed0" / "version_0"
    log_losses(run, {24: 6.0, 49: 5.123456})
    for seed, attrs in ((0, {"log_dir": str(run)}),
                        (1, {"log_dir": str(tmp_path / "gone")}),
                        (2, {"log_dir": str(run), "loss_curve": [[25, 1.0]]})):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, user_attrs=attrs,
                                     params={"model.lr": 3e-3, "seed_everything": seed},
                                     distributions=DISTS))
    save(url, tmp_path / "archive.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "archive.jsonl").read_text().splitlines()]
    attrs = [line["user_attrs"] for line in lines[1:]]
    assert attrs[0]["loss_curve"] == [[24, 6.0], [49, 5.123]]
    assert attrs[0]["loss_curve_from"] == "event files"
    assert "loss_curve" not in attrs[1] and attrs[2] == {"log_dir": str(run),
                                                         "loss_curve": [[25, 1.0]]}
    assert "loss_curve" not in optuna.load_study(study_name="old", storage=url).trials[0].user_attrs
