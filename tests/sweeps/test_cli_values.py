"""Command-line values checked where they are parsed, and help that shows.

``run --threads``/``--trials`` take positive integers (one line, before anything is queued);
``sweeps.same_computation --help`` prints its help; a spec's ``lr: [1e-3]`` (a string to
PyYAML) is a number; a grid key main.py does not know points at ``main.py fit --help``;
``run --help`` lists the profiles there are.
"""

import os

import pytest
import yaml
from paths import ROOT
from test_sweep_errors import one_error_line
from test_sweeps import write_spec

from sweeps import same_computation
from sweeps.__main__ import main, parser, worker_threads
from sweeps.command import validate_points
from sweeps.spec import SpecError, load_spec


@pytest.mark.parametrize("option,value", [("--threads", "-1"), ("--threads", "0"),
                                          ("--trials", "0"), ("--trials", "x")])
def test_threads_and_trials_must_be_positive_integers(tmp_path, capsys, option, value):
    spec = write_spec(tmp_path, "values", {"seed": [0]})
    db = tmp_path / "db.sqlite"
    with pytest.raises(SystemExit) as stop:
        main(["run", str(spec), "--storage", f"sqlite:///{db}", "--runs", str(tmp_path / "runs"),
              option, value])
    assert stop.value.code == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: argument {option}: must be a positive integer, got '{value}'")
    assert not db.exists()  # nothing queued


def test_same_computation_help_shows_the_help(capsys):
    for argv in (["--help"], ["-h"], ["other", "--help", "--", "--config", "x.yaml"]):
        with pytest.raises(SystemExit) as stop:
            same_computation.main(argv)
        assert stop.value.code == 0
        out = capsys.readouterr()
        assert out.out.startswith("usage: python -m sweeps.same_computation OTHER") \
            and "-- FIT_ARGS" in out.out and out.err == ""


@pytest.mark.parametrize("lr", ["[1e-3, 3e-3]", "[1e-3, 0.003]", "['1e-3']"])
def test_lr_in_exponent_form_without_a_dot_is_a_number(tmp_path, lr):
    path = tmp_path / "s.yaml"
    path.write_text(f"study: s\nconfigs: []\nprofile: smoke\ngrid: {{seed: [0]}}\nlr: {lr}\n")
    spec = load_spec(path)
    assert spec.lr[0] == 1e-3 and all(isinstance(x, float) for x in spec.lr)
    assert spec.points()[0]["model.lr"] == 1e-3


@pytest.mark.parametrize("lr", [["fast"], ["-1e-3"], ["nan"], [True], "1e-3"])
def test_lr_that_is_no_positive_number_stops(tmp_path, lr):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"study": "s", "configs": [], "profile": "smoke",
                                    "grid": {"seed": [0]}, "lr": lr}))
    with pytest.raises(SpecError, match="lr must be a list of positive numbers"):
        load_spec(path)


def test_a_grid_key_typo_points_at_main_py_fit_help(tmp_path, capsys):
    spec = load_spec(write_spec(tmp_path, "typo", {"model.lrr": [0.1], "seed": [0]}))
    with pytest.raises(SpecError) as err:
        validate_points(spec)
    message = str(err.value)
    assert message == ('grid point {"model.lrr": 0.1}: unrecognized arguments: --model.lrr=0.1 '
                       "(run `python main.py fit --help` for the accepted options)")
    assert "__main__" not in capsys.readouterr().err


def test_help_names_the_profiles_and_report_options():
    sub = parser()._subparsers._group_actions[0].choices
    run_help = sub["run"].format_help()
    for name in (p.stem for p in (ROOT / "configs" / "profiles").glob("*.yaml")):
        assert name in run_help
    report = {a.dest: a.help for a in sub["report"]._actions}
    assert report["profile"] and report["out"] and report["size"]


def test_threads_per_worker_follow_the_flag_then_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert worker_threads(None, 1) == 1 and worker_threads(3, 1) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert worker_threads(None, 1) == max(1, os.cpu_count() or 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert worker_threads(None, 2) == max(1, (os.cpu_count() or 1) // 2)
