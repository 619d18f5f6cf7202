"""Files others send, refused with one line (issue 37): specs whose names would leave
``runs/``/``results/``, archives of the wrong shape, checkpoints whose unpickling would run
code (a ``best:<study>`` reference, a resumed run's ``last.ckpt``), and queued points the spec
does not name."""

import json

import optuna
import pytest
import yaml
from hostile import hostile_checkpoint
from optuna.distributions import CategoricalDistribution
from test_archive import a_study
from test_sweeps import write_spec

from sweeps.archive import restore, save
from sweeps.params import point_problem
from sweeps.spec import SpecError, load_spec
from sweeps.storage import StorageError
from sweeps.worker import run_trial


@pytest.mark.parametrize("change,needle", [
    ({"study": "../escape"}, "study '../escape' must not contain / or \\"),
    ({"study": ".."}, "study '..' must not be . or .."),
    ({"study": "a\0b"}, "study 'a\\x00b' must not contain NUL"),
    ({"study": "x" * 300}, "must be at most 200 bytes long"),
    ({"plots": [{"x": "p", "name": "../../escape"}]}, "plots[0].name '../../escape' must not"),
    ({"grid": {"model.mixers": [["conv", "li\0near"]]}},
     "grid.model.mixers value 'li\\x00near' contains NUL"),
    ({"grid": {"model.init_from": ["x" * 250]}}, "the run folder of grid point"),
])
def test_spec_names_that_would_leave_the_output_folders_are_refused(tmp_path, change, needle):
    spec = write_spec(tmp_path, "ok", {"seed_everything": [0]})
    raw = {**yaml.safe_load(spec.read_text()), **change}
    spec.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def archive_lines(tmp_path):
    """A saved archive of :func:`test_archive.a_study`, as records to corrupt."""
    a_study(f"sqlite:///{tmp_path / 'a.db'}")
    archive = tmp_path / "archive.jsonl"
    save(f"sqlite:///{tmp_path / 'a.db'}", archive)
    return [json.loads(line) for line in archive.read_text().splitlines()]


def set_field(record, path, value):
    *parents, last = path.split(".")
    for key in parents:
        record = record[key]
    record[last] = value


@pytest.mark.parametrize("line,field,value,needle", [
    (0, "study", "../escape", "study '../escape' must not contain /"),
    (0, "study", "a/b", "must not contain /"),
    (0, "study", "..", "must not be . or .."),
    (0, "study", "a\0b", "must not contain NUL"),
    (0, "study", ["list"], "is not a sweep archive line"),
    (0, "study", "_arbench_lock::s", "is a queueing lock, not a study"),
    (0, "directions", ["sideways"], "directions must be a list of maximize or minimize"),
    (1, "number", "0", "number must be an integer from 0 to 2147483647"),
    (1, "number", 2**40, "number must be an integer from 0 to 2147483647"),
    (1, "values", ["high"], "values must be a list of numbers"),
    (1, "state", "HACKED", "state must be one of"),
    (1, "user_attrs.wall_time_s", 10**30, "holds an integer too large to store"),
    (1, "intermediate_values", [[10**12, 0.5]], "step must be an integer from 0"),
    (1, "params.model.lr", "0.003", "is not an Optuna distribution of its param's value"),
    (1, "datetime_start", "yesterday", "datetime_start must be an ISO date"),
    (1, "system_attrs.fixed_params", {"seed_everything": "a\0b"}, "run folder"),
    (1, "extra", 1, "unknown key(s) extra"),
])
def test_a_hostile_archive_restores_nothing(tmp_path, line, field, value, needle):
    lines = archive_lines(tmp_path)
    good = {**lines[0], "study": "good"}  # a valid study before the bad one: not kept either
    good_trials = [{**r, "study": "good"} for r in lines[1:]]
    if field == "params.model.lr":
        lines[line]["params"]["model.lr"] = value
    else:
        set_field(lines[line], field, value)
    if field == "study":
        for record in lines[1:]:
            record["study"] = value
    archive = tmp_path / "hostile.jsonl"
    archive.write_text("".join(json.dumps(r) + "\n" for r in [good, *good_trials, *lines]))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with pytest.raises(StorageError) as err:
        restore(archive, url)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert optuna.get_all_study_names(url) == []


@pytest.mark.parametrize("text", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_archive_lines_too_big_to_parse_are_one_line(tmp_path, text):
    archive = tmp_path / "huge.jsonl"
    archive.write_text(f'{{"study": "s", "directions": ["maximize"], "x": {text}}}\n')
    with pytest.raises(StorageError, match="huge.jsonl:1 is not a sweep archive line"):
        restore(archive, f"sqlite:///{tmp_path / 'b.db'}")


def test_a_queued_point_the_spec_does_not_name_never_runs(tmp_path):
    spec = load_spec(write_spec(tmp_path, "named", {"seed_everything": [0]}))
    assert point_problem({"seed_everything": 5, "model.lr": 0.1}, spec) is None  # numbers
    assert "trainer.callbacks, which is not a grid key" in point_problem(
        {"seed_everything": 0, "trainer.callbacks": "os.system"}, spec)
    spec = load_spec(write_spec(tmp_path, "configs", {"config": ["configs/p4.yaml"]}))
    assert "is not a value" in point_problem({"config": "/tmp/evil.yaml"}, spec)


def test_refs_and_resumes_never_load_a_hostile_checkpoint(tmp_path, monkeypatch):
    """A ``best:<study>`` whose checkpoint would run code, and a run folder whose
    ``last.ckpt`` would: each trial fails with the refusal as its reason, the code never runs."""
    from sweeps.queue import enqueue_grid
    from sweeps.storage import open_storage
    from sweeps.study import make_study

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = open_storage(url)
    marker = tmp_path / "MARKER"
    stage1 = optuna.create_study(study_name="stage1", storage=storage, direction="maximize")
    dists = {"model.lr": CategoricalDistribution([3e-3]),
             "seed_everything": CategoricalDistribution([0])}
    evil = hostile_checkpoint(tmp_path / "evil.ckpt", marker)
    stage1.add_trial(optuna.trial.create_trial(
        params={"model.lr": 3e-3, "seed_everything": 0}, distributions=dists, value=0.9,
        user_attrs={"last_checkpoint": str(evil)}))
    specs = [load_spec(write_spec(tmp_path, "stage2", {"model.init_from": ["best:stage1"],
                                                       "seed_everything": [0]})),
             load_spec(write_spec(tmp_path, "resumed", {"seed_everything": [0]}))]
    folder = tmp_path / "runs" / "resumed" / "lr0.003_seed0" / "checkpoints"
    folder.mkdir(parents=True)
    hostile_checkpoint(folder / "last.ckpt", marker)
    for spec, needle in ((specs[0], "init_from: "), (specs[1], "resume from ")):
        study = make_study(spec, storage)
        enqueue_grid(study, spec, storage)
        trial = optuna.Trial(study, study.get_trials()[0]._trial_id)
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.RUNNING)
        run_trial(study, trial, spec, storage, tmp_path / "runs", print)
        [done] = study.get_trials()
        assert done.state == optuna.trial.TrialState.FAIL
        reason = done.user_attrs["fail_reason"]
        assert needle in reason and "refused: it holds an object other than tensors" in reason
    assert not marker.exists()
