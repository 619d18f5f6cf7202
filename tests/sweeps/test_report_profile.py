"""``report`` and ``suite`` read a study at the profile and size it ran at.

A study run with ``--profile smoke --size tiny`` records both (``sweeps.study.make_study``);
reporting it without ``--profile`` must not title smoke numbers with the spec's default profile,
a ``--profile``/``--size`` other than the study's stops in one line before anything is written,
and a study with no finished run never overwrites an existing table. Synthetic studies (trials
recorded straight into a temp SQLite storage, nothing trained); every report goes to tmp.
"""

from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState, create_trial
from test_sweep_errors import one_error_line

from sweeps.__main__ import main
from sweeps.params import point_distributions
from sweeps.spec import load_spec


def write_spec(tmp: Path, study: str) -> Path:
    """A spec whose default profile is cpu (p 2 and 4, two lrs) and whose smoke profile runs
    p 2 alone at one lr."""
    path = tmp / f"{study}.yaml"
    path.write_text(yaml.safe_dump({
        "study": study, "configs": [], "profile": "cpu", "grid": {"p": [2, 4], "seed": [0, 1]},
        "lr": [1e-3, 3e-3],
        "profiles": {"smoke": {"grid": {"p": [2], "seed": [0, 1]}, "lr": [3e-3]}}}))
    return path


def record(url: str, spec_path: Path, profile: str, size: str | None,
           finished: bool = True) -> None:
    """The spec's study as ``run --profile PROFILE --size SIZE`` leaves it: its profile and
    size recorded, each point finished (or, ``finished=False``, no trial at all)."""
    spec = load_spec(spec_path, profile, size)
    study = optuna.create_study(study_name=spec.study, storage=url, direction="maximize")
    study.set_user_attr("profile", profile)
    study.set_user_attr("size", size)
    if not finished:
        return
    for point in spec.points():
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=0.5, params=point,
            distributions=point_distributions(point, spec, {}),
            user_attrs={"slices": {"A": 0.5}, "hparams": {
                "feature_map": "LLoPS", "p": point["model.feature_map.init_args.p"], "m": 64,
                "rank": 1, "state_size": 64 * 32}},
            system_attrs={"fixed_params": point}))


def report(url: str, spec: Path, out: Path, *extra: str) -> int:
    return main(["report", str(spec), "--storage", url, "--out", str(out), *extra])


def test_report_reads_the_study_at_the_profile_and_size_it_ran_at(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = write_spec(tmp_path, "t_smoke")
    record(url, spec, "smoke", "tiny")
    out = tmp_path / "out"
    assert report(url, spec, out) == 0, capsys.readouterr().err
    md = (out / "t_smoke" / "table.md").read_text()
    assert md.startswith("# t_smoke (smoke profile)")
    assert "p=4" not in md and "p4" not in md  # the cpu grid's point never ran
    assert report(url, spec, out, "--profile", "smoke", "--size", "tiny") == 0


def test_a_report_at_one_profile_does_not_overwrite_one_at_another(tmp_path, capsys):
    """A smoke study's report into the folder that holds the committed (cpu) one stops."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = write_spec(tmp_path, "t_smoke")
    record(url, spec, "smoke", "tiny")
    table = tmp_path / "out" / "t_smoke" / "table.md"
    table.parent.mkdir(parents=True)
    table.write_text("# t_smoke (cpu profile)\n\ncommitted\n")
    assert report(url, spec, tmp_path / "out") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (f"error: {table} is the report of study t_smoke at profile cpu; this "
                    "storage's ran at profile smoke: not writing over it (give another --out)")
    assert table.read_text() == "# t_smoke (cpu profile)\n\ncommitted\n"


def test_report_at_another_profile_or_size_stops_with_one_line(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = write_spec(tmp_path, "t_smoke")
    record(url, spec, "smoke", "tiny")
    out = tmp_path / "out"
    for extra in (["--profile", "cpu"], ["--size", "teacher"],
                  ["--profile", "smoke", "--size", "teacher"]):
        capsys.readouterr()
        assert report(url, spec, out, *extra) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: study t_smoke ran at profile smoke, size tiny, not what "
                               f"{' '.join(extra)} asks for"), line
    assert not (out / "t_smoke").exists()


def test_a_study_with_no_finished_run_does_not_overwrite_a_table(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    spec = write_spec(tmp_path, "t_empty")
    record(url, spec, "smoke", "tiny", finished=False)
    table = tmp_path / "out" / "t_empty" / "table.md"
    table.parent.mkdir(parents=True)
    table.write_text("committed\n")
    assert report(url, spec, tmp_path / "out") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: study t_empty has no finished run yet: not writing")
    assert table.read_text() == "committed\n"
    assert sorted(p.name for p in table.parent.iterdir()) == ["table.md"]


def test_suite_reads_each_study_at_its_profile_and_refuses_another(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    specs = [write_spec(tmp_path, "t_alpha"), write_spec(tmp_path, "t_beta")]
    for spec in specs:
        record(url, spec, "smoke", "tiny")
    out = tmp_path / "suite"
    args = ["suite", *map(str, specs), "--storage", url, "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    md = (out / "table.md").read_text()
    assert "- alpha: study `t_alpha`, smoke profile" in md
    assert "- beta: study `t_beta`, smoke profile" in md
    capsys.readouterr()
    table = md
    assert main([*args, "--profile", "cpu"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: study t_alpha ran at profile smoke, size tiny, not what --profile cpu asks for")
    assert (out / "table.md").read_text() == table


def test_a_suite_with_no_finished_run_does_not_overwrite_its_table(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    specs = [write_spec(tmp_path, "t_alpha"), write_spec(tmp_path, "t_beta")]
    record(url, specs[0], "smoke", "tiny", finished=False)
    out = tmp_path / "suite"
    out.mkdir()
    (out / "table.md").write_text("committed\n")
    assert main(["suite", *map(str, specs), "--storage", url, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: the suite's studies have no finished run yet: not writing")
    assert (out / "table.md").read_text() == "committed\n"


def test_a_suite_study_not_run_yet_is_read_at_the_profile_the_others_ran_at(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    specs = [write_spec(tmp_path, "t_alpha"), write_spec(tmp_path, "t_beta")]
    record(url, specs[0], "smoke", "tiny")
    out = tmp_path / "suite"
    assert main(["suite", *map(str, specs), "--storage", url, "--out", str(out)]) == 0, \
        capsys.readouterr().err
    assert "- beta: study `t_beta`, smoke profile" in (out / "table.md").read_text()
