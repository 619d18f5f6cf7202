"""Sweep cases of issue #16: failed trials exit non-zero and can be retried, ``--runs`` is
checked before any trial, ``report`` of a study that never ran writes nothing, the queueing
lock never shows beside the user's studies, ``--help`` reads well."""

import optuna
import pytest
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState
from sqlalchemy.exc import DataError, ProgrammingError
from test_sweeps import GRID4, sweep, write_spec

import sweeps.__main__ as cli


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_failed_trials_exit_nonzero_and_retry_failed_requeues_them(tmp_path):
    spec = write_spec(tmp_path, "retry", {"seed_everything": [0]})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "retry").write_text("")  # a file where the study's run folders go: the trial fails
    first = sweep("run", str(spec), "--storage", url, "--runs", str(runs), cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-2000:]
    assert "fail 1" in first.stdout
    line = one_error_line(first.stderr)
    assert line.startswith("error: 1 grid point(s) failed, e.g. lr0.003_seed0: ")
    assert line.endswith("rerun with --retry-failed")

    (runs / "retry").unlink()  # the cause is fixed; a plain rerun queues nothing, still fails
    again = sweep("run", str(spec), "--storage", url, "--runs", str(runs), cwd=tmp_path)
    assert again.returncode == 1 and "0 newly queued" in again.stdout
    retried = sweep("run", str(spec), "--storage", url, "--runs", str(runs), "--retry-failed",
                    cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr[-2000:]
    assert "0 newly queued, 1 failed queued again" in retried.stdout
    trials = optuna.load_study(study_name="retry", storage=url).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].system_attrs["fixed_params"] == trials[0].system_attrs["fixed_params"]
    assert trials[1].system_attrs["failed_trial"] == 0
    assert "fail_reason" not in trials[1].user_attrs
    assert optuna.get_all_study_names(url) == ["retry"]  # no lock study left in sight


def test_unwritable_runs_fails_before_any_trial(tmp_path):
    spec = write_spec(tmp_path, "ro", GRID4)
    (tmp_path / "file").write_text("")
    out = sweep("run", str(spec), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--runs",
                str(tmp_path / "file" / "runs"), cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert "--runs" in one_error_line(out.stderr) and "is not a folder" in out.stderr
    assert not (tmp_path / "db.sqlite").exists()


def test_report_of_a_study_that_never_ran_writes_nothing(tmp_path):
    spec = write_spec(tmp_path, "never", GRID4)
    out = sweep("report", str(spec), cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert one_error_line(out.stderr).startswith("error: no sweep database at runs/sweeps.db")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    optuna.create_study(study_name="other", storage=url)
    out = sweep("report", str(spec), "--storage", url, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert one_error_line(out.stderr).startswith("error: study never has not run")
    assert not (tmp_path / "results").exists()


def test_queueing_lock_leaves_no_study_and_failed_points_are_found(tmp_path):
    from sweeps.queue import enqueue_grid
    from sweeps.spec import load_spec
    from sweeps.storage import open_storage
    from sweeps.study import make_study
    from sweeps.trials import failed_points

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = open_storage(url)
    spec = load_spec(write_spec(tmp_path, "lock", GRID4))
    study = make_study(spec, storage)
    assert enqueue_grid(study, spec, storage) == (4, 0)
    assert enqueue_grid(study, spec, storage) == (0, 0)
    assert optuna.get_all_study_names(storage) == ["lock"]
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    assert [t.number for t in failed_points(study.get_trials())] == [0]
    assert enqueue_grid(study, spec, storage, retry_failed=True) == (0, 1)
    assert failed_points(study.get_trials()) == []  # its point is waiting again


def test_help_reads_well(tmp_path):
    out = sweep("--help", cwd=tmp_path, timeout=60, check=True)
    assert "``" not in out.stdout and "Optuna sweeps of main.py" in out.stdout
    assert "--retry-failed" in sweep("run", "--help", cwd=tmp_path, timeout=60).stdout


def test_several_specs_run_one_after_another_and_a_bad_one_stops_none_midway(tmp_path):
    first = write_spec(tmp_path, "first", {"seed_everything": [0]})
    second = write_spec(tmp_path, "second", {"seed_everything": [0, 1]})
    bad = write_spec(tmp_path, "bad", {"model.feature_map.init_args.p": [0]})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(first), str(bad), "--storage", url, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert "grid point" in one_error_line(out.stderr) and "init_args.p" in out.stderr
    assert not (tmp_path / "db.sqlite").exists()  # checked before the first sweep began

    out = sweep("run", str(first), str(second), "--storage", url, "--workers", "2",
                "--threads", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    order = [ln.split("] study ")[1].split()[0] for ln in out.stdout.splitlines()
             if "] study " in ln and "grid points" in ln]
    assert order == ["first", "second"]
    for study, n in (("first", 1), ("second", 2)):
        trials = optuna.load_study(study_name=study, storage=url).get_trials()
        assert [t.state for t in trials] == [TrialState.COMPLETE] * n
    done_first = max(t.datetime_complete for t in
                     optuna.load_study(study_name="first", storage=url).get_trials())
    assert all(t.datetime_start > done_first for t in
               optuna.load_study(study_name="second", storage=url).get_trials())


def test_widen_applies_to_the_specs_with_an_lr_sub_grid(tmp_path):
    one_lr = write_spec(tmp_path, "one_lr", {"seed_everything": [0]})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = sweep("run", str(one_lr), "--widen", "1", "--storage", url, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert "lr sub-grid of at least 2 lrs" in one_error_line(out.stderr)

    two_lrs = write_spec(tmp_path, "two_lrs", {"seed_everything": [0]}, lr=[3e-3, 1e-2])
    out = sweep("run", str(two_lrs), str(one_lr), "--widen", "1", "--storage", url,
                cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "one_lr: no lr sub-grid of 2 or more lrs" in out.stdout
    widened = optuna.load_study(study_name="two_lrs", storage=url).get_trials()
    assert len(widened) == 3  # the edge best lr got one more beyond it
    assert len(optuna.load_study(study_name="one_lr", storage=url).get_trials()) == 1


def test_a_study_keeps_the_profile_and_size_its_runs_trained_at(tmp_path):
    """A smoke run of a spec against the storage of its real study would take the places of
    the study's points (a point is its grid values, whatever the profile): it stops in one
    line, and a study with no runs yet takes any profile."""
    from optuna.trial import create_trial

    from sweeps.params import point_distributions
    from sweeps.spec import SpecError, load_spec
    from sweeps.study import make_study

    path = write_spec(tmp_path, "kept", {"seed_everything": [0]})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    empty = make_study(load_spec(path, profile="cpu"), url)  # no runs: anything goes
    assert empty.user_attrs["profile"] == "cpu"
    spec = load_spec(path)  # smoke, size tiny
    study = make_study(spec, url)
    point = spec.points()[0]
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, params=point,
                                 distributions=point_distributions(point, spec, {}),
                                 system_attrs={"fixed_params": point}))
    make_study(load_spec(path), url)  # the same again
    with pytest.raises(SpecError, match="study kept ran at profile smoke, size tiny, this run "
                                        "asks for profile cpu, size tiny"):
        make_study(load_spec(path, profile="cpu"), url)
    done = sweep("run", str(path), "--size", "teacher", "--storage", url, cwd=tmp_path)
    assert done.returncode != 0
    assert "asks for profile smoke, size teacher: give it another --storage" in \
        one_error_line(done.stderr)


def refused(kind: str) -> Exception:
    """A database error that is no lost connection, its driver message quoting a password:
    Optuna's wrapper of a rejected statement, or the SQLAlchemy error itself."""
    if kind == "DataError":
        return DataError("INSERT INTO trial_user_attributes", {},
                         Exception("value too long for type character varying(2048): "
                                   "TopSecret99"))
    try:
        raise ProgrammingError("INSERT INTO studies", {},
                               Exception("permission denied for table studies (user alice, "
                                         "password TopSecret99)"))
    except ProgrammingError as err:
        try:
            raise StorageInternalError("An exception is raised during the commit.") from err
        except StorageInternalError as wrapped:
            return wrapped


@pytest.mark.filterwarnings("ignore:Query string argument")  # SQLite ignores ?password=
@pytest.mark.parametrize("kind", ["StorageInternalError", "DataError"])
def test_a_refused_database_request_is_one_line_without_the_password(tmp_path, monkeypatch,
                                                                     capsys, kind):
    """A database error other than a lost connection (a missing privilege, a value too long)
    prints one scrubbed line and exits with status 2, not a traceback."""
    def restore(*_args, **_kwargs):
        raise refused(kind)

    monkeypatch.setattr(cli, "restore", restore)
    (tmp_path / "archive.jsonl").write_text("")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}?password=TopSecret99"  # SQLite ignores it
    assert cli.main(["restore", str(tmp_path / "archive.jsonl"), "--storage", url]) == 2
    err = capsys.readouterr().err
    line = one_error_line(err)
    assert line.startswith("error: the storage refused a request: ")
    assert ("permission denied" if kind != "DataError" else "value too long") in line
    assert "TopSecret99" not in err and "***" in line
