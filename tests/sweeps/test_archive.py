"""A storage saved to a JSON Lines archive and restored on a new machine (``sweeps.archive``)."""

import json
import shutil
import sqlite3

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from sqlalchemy.exc import OperationalError
from test_loss_curves import log_losses
from test_sweeps import sweep, write_spec

from sweeps.archive import check_not_half_restored, dropped_trials, half_restored, restore, save
from sweeps.storage import StorageError

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


def saved_lines(tmp_path, name: str = "s") -> tuple:
    """:func:`a_study` saved to ``archive.jsonl``: the archive and its records."""
    a_study(f"sqlite:///{tmp_path / 'a.db'}", name)
    archive = tmp_path / "archive.jsonl"
    save(f"sqlite:///{tmp_path / 'a.db'}", archive)
    return archive, [json.loads(line) for line in archive.read_text().splitlines()]


def cut_off_restore(archive, url: str, monkeypatch, after: int = 2) -> None:
    """A restore whose storage goes away after ``after`` trials, so that deleting the half
    study fails too (what a SIGKILL also leaves)."""
    def lost(*_args, **_kwargs):
        raise OperationalError("INSERT", {}, Exception("server closed the connection"))

    add_trial = optuna.Study.add_trial
    added = []

    def add_some(study, trial):
        if len(added) == after:
            lost()
        added.append(trial.number)
        add_trial(study, trial)

    with monkeypatch.context() as patch:
        patch.setattr(optuna.Study, "add_trial", add_some)
        patch.setattr(optuna, "delete_study", lost)
        with pytest.raises(OperationalError):
            restore(archive, url)


def test_a_restore_cut_off_part_way_is_refused_until_the_next_restore_redoes_it(
        tmp_path, monkeypatch):
    archive, _ = saved_lines(tmp_path)
    url = f"sqlite:///{tmp_path / 'b.db'}"
    cut_off_restore(archive, url, monkeypatch)
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 2  # half of it
    assert half_restored(url) == {"s": str(archive)}
    for names in (["s"], None):
        with pytest.raises(StorageError, match=r"study s holds only part of its archive \(its "
                           rf"restore was cut off\): rerun `python -m sweeps restore {archive}`"):
            check_not_half_restored(url, names)
    check_not_half_restored(url, ["other"])
    with pytest.raises(StorageError, match="study s holds only part of its archive"):
        save(url, tmp_path / "other.jsonl")  # it would be archived as if whole
    assert not (tmp_path / "other.jsonl").exists()

    said = []
    assert restore(archive, url, say=said.append) == ({"s": 5}, [])
    assert said == [f"restoring s again: its restore from {archive} was cut off with 2 "
                    "trial(s) in"]
    assert [t.number for t in optuna.load_study(study_name="s", storage=url).trials] == \
        [0, 1, 2, 3, 4]
    assert half_restored(url) == {}
    check_not_half_restored(url)
    assert restore(archive, url, say=said.append) == ({}, ["s"]) and len(said) == 1


def test_the_command_restores_a_cut_off_study_again_and_says_so(tmp_path, monkeypatch):
    archive, _ = saved_lines(tmp_path)
    url = f"sqlite:///{tmp_path / 'b.db'}"
    cut_off_restore(archive, url, monkeypatch, after=0)
    out = sweep("restore", str(archive), "--storage", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"restoring s again: its restore from {archive} was cut off with 0 trial(s) in",
        "restored s: 5 trial(s)"]


def test_status_and_save_commands_refuse_a_half_restored_study_in_one_line(tmp_path,
                                                                           monkeypatch):
    archive, _ = saved_lines(tmp_path)
    url = f"sqlite:///{tmp_path / 'b.db'}"
    cut_off_restore(archive, url, monkeypatch)
    for command in (["status"], ["save", str(tmp_path / "other.jsonl")]):
        out = sweep(*command, "--storage", url, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("error: study s holds only part of its archive")
    assert not (tmp_path / "other.jsonl").exists()


def test_the_save_command_drops_archived_runs_only_with_replace(tmp_path):
    archive, _ = saved_lines(tmp_path)
    before = archive.read_text()
    fresh = f"sqlite:///{tmp_path / 'b.db'}"
    study = optuna.create_study(study_name="s", storage=fresh, direction="maximize")
    study.add_trial(create_trial(value=0.5, distributions=DISTS,
                                 params={"model.lr": 3e-3, "seed_everything": 2}))
    out = sweep("save", str(archive), "--storage", fresh, cwd=tmp_path)
    assert out.returncode == 2 and "save with --replace s" in out.stderr
    assert archive.read_text() == before
    out = sweep("save", str(archive), "--replace", "s", "--storage", fresh, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("saved s: 1 trial(s)\n"), out.stderr


def test_an_empty_study_left_as_a_restore_began_is_restored_but_a_kept_one_is_not(tmp_path):
    archive, _ = saved_lines(tmp_path)
    url = f"sqlite:///{tmp_path / 'b.db'}"
    optuna.create_study(study_name="s", storage=url)  # killed before its mark was set
    said = []
    assert restore(archive, url, say=said.append) == ({"s": 5}, [])
    assert said == ["restoring s again: the storage holds it empty (a restore cut off as it "
                    "began)"]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    optuna.create_study(study_name="s", storage=url).set_user_attr("profile", "smoke")
    assert restore(archive, url, say=said.append) == ({}, ["s"]) and len(said) == 1


def test_save_refuses_to_drop_archived_runs_the_storage_lacks(tmp_path):
    archive, _ = saved_lines(tmp_path)  # machine A's: trial 0 complete, 1 pruned
    before = archive.read_text()
    fresh = f"sqlite:///{tmp_path / 'b.db'}"  # machine B started the study anew
    study = optuna.create_study(study_name="s", storage=fresh, direction="maximize")
    for seed in (0, 1):
        study.add_trial(create_trial(value=0.5, distributions=DISTS,
                                     params={"model.lr": 3e-3, "seed_everything": seed}))
    with pytest.raises(StorageError) as err:
        save(fresh, archive)
    assert str(err.value) == (
        f"{archive} holds 2 finished trial(s) of study s that this storage lacks (number 0, 1; "
        "the storage has 2 trial(s)): saving would drop them, so nothing was saved; restore "
        "the archive into a storage without s and go on there, or save with --replace s to "
        "drop them")
    assert archive.read_text() == before
    assert save(fresh, archive, replace=["s"]) == {"s": 2}  # asked for: dropped
    assert len(archive.read_text().splitlines()) == 3


def test_save_after_restoring_keeps_every_run_and_adds_the_new_ones(tmp_path):
    archive, lines = saved_lines(tmp_path)
    url = f"sqlite:///{tmp_path / 'b.db'}"
    restore(archive, url)
    optuna.load_study(study_name="s", storage=url).add_trial(create_trial(
        value=0.5, distributions=DISTS, params={"model.lr": 3e-3, "seed_everything": 1}))
    with sqlite3.connect(tmp_path / "b.db") as db:  # the pruned run marked failed by hand, as
        db.execute("UPDATE trials SET state = 'FAIL' WHERE number = 1")  # diagnosis trial 131
    assert save(url, archive) == {"s": 6}
    after = [json.loads(line) for line in archive.read_text().splitlines()]
    assert after[1:] == [*lines[1:2], {**lines[2], "state": "FAIL"}, *lines[3:], after[-1]]
    assert after[-1]["number"] == 5


@pytest.mark.parametrize("line,where,key,value,needle", [
    (5, "system_attrs", "retry_history", "oops",
     "system_attrs.retry_history must be a list of trial numbers, got 'oops'"),
    (5, "system_attrs", "retry_history", [0, "1"], "must be a list of trial numbers"),
    (5, "system_attrs", "failed_trial", "0", "system_attrs.failed_trial must be a trial number"),
    (2, "system_attrs", "completed_rung_0", "0.5",
     "system_attrs.completed_rung_0 must be a number"),
    (1, "user_attrs", "wall_time_s", "an hour",
     "user_attrs.wall_time_s must be a number, got 'an hour'"),
    (1, "user_attrs", "wall_time_s", None, "user_attrs.wall_time_s must be a number"),
    (1, "user_attrs", "global_step", 1.5, "user_attrs.global_step must be an integer or null"),
    (1, "user_attrs", "val_acc", "0.9", "user_attrs.val_acc must be a number or null"),
    (1, "user_attrs", "val_curve", [[250, "0.5"]], "must be a list of [step, number] pairs"),
    (1, "user_attrs", "loss_curve", [["25", 1.0]], "must be a list of [step, number] pairs"),
    (1, "user_attrs", "slices", {"L64": "high"}, "user_attrs.slices must be a mapping of numbers"),
    (1, "user_attrs", "hparams", ["d_model"], "user_attrs.hparams must be a mapping or null"),
    (1, "user_attrs", "converged", "yes", "user_attrs.converged must be true, false or null"),
    (1, "user_attrs", "last_checkpoint", 7, "user_attrs.last_checkpoint must be text or null"),
    (0, "user_attrs", "size", 3, "user_attrs.size must be text or null"),
    (1, "user_attrs", "k" * 513, 1, "user_attrs has a key of 513 characters ('kkkk"),
    (0, "user_attrs", "k" * 600, 1, "longer than the database's 512"),
    (1, "system_attrs", "a\0b", 1, "system_attrs has a key with a NUL character ('a\\x00b'), "
     "which PostgreSQL cannot store"),
    (1, "params", "x" * 513, 0.5, "params has a key of 513 characters"),
])
def test_attrs_of_a_type_the_sweeps_cannot_read_restore_nothing(tmp_path, line, where, key,
                                                                value, needle):
    """A retry's history that is not a list of numbers restored, then failed every `run` in
    Optuna's stale retry; a wall time as text failed `status`; a key PostgreSQL refuses failed
    the restore half-way."""
    archive, lines = saved_lines(tmp_path)
    lines[line][where][key] = value
    if where == "params":
        lines[line]["distributions"][key] = lines[line]["distributions"]["model.lr"]
    archive.write_text("".join(json.dumps(r) + "\n" for r in lines))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with pytest.raises(StorageError) as err:
        restore(archive, url)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(err.value).endswith("; nothing was restored")
    assert optuna.get_all_study_names(url) == []


def test_attrs_of_the_types_the_sweeps_record_restore(tmp_path):
    archive, lines = saved_lines(tmp_path)
    lines[0]["user_attrs"].update(size=None, metric="val/acc", spec="configs/sweeps/s.yaml")
    lines[1]["user_attrs"].update(
        {"k" * 512: 1, "global_step": 500, "val_acc": 0.75, "last_val_acc": None,
         "example_acc": 1, "collapsed_at": None, "loss_curve": [[25, 2.5]], "slices": {"L64": 1},
         "example_slices": None, "hparams": {"d_model": 64}, "converged": True, "device": "cpu",
         "diverged": "loss is nan", "config": "model: {}\n", "reused_from": None})
    lines[5]["system_attrs"].update(failed_trial=3, retry_history=[3])
    archive.write_text("".join(json.dumps(r) + "\n" for r in lines))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    assert restore(archive, url) == ({"s": 5}, [])
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert trials[0].user_attrs == lines[1]["user_attrs"]
    assert trials[4].system_attrs["retry_history"] == [3]


def test_runs_of_one_point_started_in_one_second_are_told_apart():
    """Matching archived runs to stored ones: params and start to the microsecond; to the
    second only where a database dropped the fraction (either side)."""
    params = {"model.lr": 3e-3, "seed_everything": 0}

    def line(start: str, number: int = 0) -> dict:
        return {"number": number, "state": "COMPLETE", "params": params,
                "datetime_start": start}

    archived = [{"study": "s"}, line("2026-12-07T20:10:01.123456")]
    assert dropped_trials(archived, [{"study": "s"}, line("2026-12-07T20:10:01.567890")]) \
        == archived[1:]
    for stored in ("2026-12-07T20:10:01.123456", "2026-12-07T20:10:01"):
        assert dropped_trials(archived, [{"study": "s"}, line(stored, 7)]) == []
    assert dropped_trials([{"study": "s"}, line("2026-12-07T20:10:01")],
                          [{"study": "s"}, line("2026-12-07T20:10:01.5")]) == []
