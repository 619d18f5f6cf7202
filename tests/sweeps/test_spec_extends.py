"""``extends:`` in a sweep spec: the base's keys, top-level keys of the extending file replacing
the base's, ``profiles:`` merged per profile name; one level only, each misuse one line."""

from pathlib import Path

import pytest
import yaml
from test_sweep_errors import one_error_line

from sweeps.__main__ import main
from sweeps.spec import SpecError, load_spec, read_spec

BASE = {"configs": [], "grid": {"p": [2, 4], "seed": [0]}, "lr": [1e-3, 3e-3],
        "description": "the base's", "reuse": ["older"],
        "claims": [{"name": "p=4 > p=2", "better": {"p": 4}, "worse": {"p": 2}}],
        "profiles": {"smoke": {"grid": {"p": [2], "seed": [0]}, "lr": [3e-3], "reuse": []},
                     "paper": {"lr": [1e-2]}}}


def write(path: Path, mapping: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write(tmp_path / "bases" / "b.yaml", BASE)


def test_top_level_keys_replace_the_bases_and_the_rest_are_kept(tmp_path, base):
    spec = write(tmp_path / "s.yaml", {"extends": "bases/b.yaml", "study": "s",
                                       "grid": {"p": [6]}, "description": "its own"})
    raw = read_spec(spec)
    assert "extends" not in raw
    assert raw["grid"] == {"p": [6]}  # replaced whole, not merged: the base's seed is gone
    assert raw["description"] == "its own" and raw["lr"] == BASE["lr"]
    assert raw["claims"] == BASE["claims"] and raw["reuse"] == ["older"]
    loaded = load_spec(spec)
    assert loaded.study == "s" and [p["model.feature_map.init_args.p"]
                                    for p in loaded.points()] == [6, 6]


def test_profiles_merge_per_name(tmp_path, base):
    spec = write(tmp_path / "s.yaml", {
        "extends": "bases/b.yaml", "study": "s",
        "profiles": {"smoke": {"args": ["--trainer.max_steps=3"], "lr": [1e-3]},
                     "long": {"lr": [3e-4]}}})
    profiles = read_spec(spec)["profiles"]
    assert profiles == {"smoke": {"grid": {"p": [2], "seed": [0]}, "lr": [1e-3], "reuse": [],
                                  "args": ["--trainer.max_steps=3"]},
                        "paper": {"lr": [1e-2]}, "long": {"lr": [3e-4]}}
    smoke = load_spec(spec, "smoke")
    assert smoke.args == ["--trainer.max_steps=3"] and smoke.lr == [1e-3] and not smoke.reuse
    assert len(smoke.points()) == 1
    assert load_spec(spec, "paper").lr == [1e-2] and load_spec(spec, "cpu").reuse == ["older"]


def test_a_spec_without_profiles_keeps_the_bases(tmp_path, base):
    spec = write(tmp_path / "s.yaml", {"extends": "bases/b.yaml", "study": "s"})
    assert read_spec(spec)["profiles"] == BASE["profiles"]


def test_a_base_alone_is_no_study(base):
    with pytest.raises(SpecError, match="study must be a non-empty name"):
        load_spec(base)


def error(path: Path) -> str:
    """The one-line message of loading ``path``."""
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_missing_base(tmp_path):
    spec = write(tmp_path / "s.yaml", {"extends": "bases/none.yaml", "study": "s"})
    assert error(spec).endswith(f"extends bases/none.yaml, but there is no file "
                                f"{tmp_path / 'bases' / 'none.yaml'}")


@pytest.mark.parametrize("value", [None, "", 3, ["a.yaml"]])
def test_extends_is_a_path(tmp_path, value):
    spec = write(tmp_path / "s.yaml", {"extends": value, "study": "s"})
    assert "extends must be the path of a base spec, relative to this file" in error(spec)


@pytest.mark.parametrize("text", ["[1, 2]\n", "just text\n", "a: [\n"])
def test_a_base_that_is_no_mapping(tmp_path, text):
    (tmp_path / "b.yaml").write_text(text)
    spec = write(tmp_path / "s.yaml", {"extends": "b.yaml", "study": "s"})
    message = error(spec)
    assert f"extends b.yaml, but {tmp_path / 'b.yaml'} " in message
    assert message.endswith("must hold a mapping") or "is not valid YAML" in message


def test_a_chain_of_extends(tmp_path, base):
    write(tmp_path / "middle.yaml", {"extends": "bases/b.yaml", "lr": [1e-3]})
    spec = write(tmp_path / "s.yaml", {"extends": "middle.yaml", "study": "s"})
    assert error(spec).endswith(f"its base {tmp_path / 'middle.yaml'} extends bases/b.yaml in "
                                "turn (a chain); one level of extends only")


def test_a_cycle_of_extends(tmp_path):
    write(tmp_path / "a.yaml", {"extends": "b.yaml", "study": "a"})
    write(tmp_path / "b.yaml", {"extends": "a.yaml", "study": "b"})
    assert error(tmp_path / "a.yaml").endswith(f"its base {tmp_path / 'b.yaml'} extends a.yaml "
                                               "in turn (a cycle); one level of extends only")
    itself = write(tmp_path / "self.yaml", {"extends": "self.yaml", "study": "s"})
    assert "(a cycle)" in error(itself)


def test_unknown_keys_name_their_file(tmp_path, base):
    write(tmp_path / "bad.yaml", {**BASE, "colour": "red"})
    spec = write(tmp_path / "s.yaml", {"extends": "bad.yaml", "study": "s"})
    with pytest.raises(SpecError, match=r"unknown key\(s\) in bad.yaml: colour"):
        load_spec(spec)
    spec = write(tmp_path / "s.yaml", {"extends": "bases/b.yaml", "study": "s", "colour": "red"})
    with pytest.raises(SpecError, match=r"unknown key\(s\) in s.yaml: colour \(allowed: .*"
                                        r"extends"):
        load_spec(spec)
    spec = write(tmp_path / "s.yaml", {"extends": "bases/b.yaml", "study": "s",
                                       "profiles": {"smoke": {"extends": "x.yaml"}}})
    with pytest.raises(SpecError, match=r"unknown key\(s\) in profiles.smoke: extends"):
        load_spec(spec, "smoke")


def test_profiles_must_map_names_to_keys(tmp_path, base):
    spec = write(tmp_path / "s.yaml", {"extends": "bases/b.yaml", "study": "s",
                                       "profiles": {"smoke": [1]}})
    with pytest.raises(SpecError, match="profiles in s.yaml must map profile names to mappings"):
        load_spec(spec)


def test_the_command_line_says_it_in_one_line(tmp_path, capsys):
    spec = write(tmp_path / "s.yaml", {"extends": "bases/none.yaml", "study": "s"})
    code = main(["suite", str(spec), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}",
                 "--out", str(tmp_path / "suite")])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {spec}: extends bases/none.yaml, but there is no file")
    assert not (tmp_path / "suite").exists()
