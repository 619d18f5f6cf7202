"""The default profile: ``fit`` with no profile reads ``configs/profiles/cpu.yaml``; any given
profile replaces it (checked from ``--print_config``, nothing trained)."""

import pytest
import yaml
from paths import config

from arbench.cli import run
from arbench.profiles import DEFAULT_PROFILE, is_profile, with_default_profile

PROFILES = ["profiles/smoke.yaml", "profiles/paper.yaml", "profiles/long.yaml"]


def printed_config(capsys, *args: str) -> tuple[dict, str]:
    """``fit --config p4.yaml ARGS --print_config``: the printed YAML and stderr."""
    with pytest.raises(SystemExit) as exc:
        run(["fit", "--config", config("p4.yaml"), *args, "--print_config"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    return yaml.safe_load(out), err


def holds(printed, wanted) -> bool:
    """Whether ``printed`` holds every value of ``wanted`` (mappings may hold more keys)."""
    if isinstance(wanted, dict):
        return isinstance(printed, dict) and all(
            key in printed and holds(printed[key], value) for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(printed, list) and len(printed) == len(wanted) and all(
            holds(p, w) for p, w in zip(printed, wanted))
    return printed == wanted


def leaves(mapping: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """``(key, subkey, ...) -> value`` of every value that is not a mapping."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def at(mapping: dict, path: tuple):
    for key in path:
        mapping = mapping[key]
    return mapping


def test_no_profile_means_the_cpu_profile(capsys):
    printed, err = printed_config(capsys)
    cpu = yaml.safe_load(DEFAULT_PROFILE.read_text())
    assert DEFAULT_PROFILE.name == "cpu.yaml" and holds(printed, cpu)
    # a step budget: Lightning does not warn "`max_epochs` was not set"
    assert printed["trainer"]["max_steps"] > 0
    assert "using the default profile, configs/profiles/cpu.yaml" in err.replace(
        str(DEFAULT_PROFILE.parents[2]) + "/", "")


@pytest.mark.parametrize("profile", PROFILES)
def test_a_given_profile_replaces_the_default(capsys, profile):
    printed, err = printed_config(capsys, "--config", config(profile))
    given = yaml.safe_load(open(config(profile)).read())
    assert holds(printed, given)
    cpu = leaves(yaml.safe_load(DEFAULT_PROFILE.read_text()))
    mine = leaves(given)
    leaked = [path for path, value in cpu.items()
              if path not in mine and holds(at(printed, path), value)]
    assert not leaked, leaked
    assert "no profile given" not in err


def test_flags_override_the_default_profile_and_are_not_profiles(capsys):
    printed, _ = printed_config(capsys, "--trainer.max_steps", "7", "--data.vocab_size", "128")
    assert printed["trainer"]["max_steps"] == 7 and printed["data"]["vocab_size"] == 128
    assert printed["trainer"]["val_check_interval"] == 250  # the rest is still cpu's


def test_what_counts_as_a_profile(tmp_path):
    assert is_profile({"data": {"vocab_size": 64}})
    assert is_profile({"trainer": {"max_epochs": 3}})
    assert not is_profile({"model": {"d_model": 32}, "trainer": {"logger": None}})
    recipe = yaml.safe_load(open(config("recipes/zoology.yaml")).read())
    assert recipe["data"] and not is_profile(recipe)  # an overlay's data switch is no profile
    size = config("sizes/tiny.yaml")
    argv, added = with_default_profile(["fit", "--config", size], ["fit", "test"])
    assert added and argv == ["fit", "--config", str(DEFAULT_PROFILE), "--config", size]
    smoke = config("profiles/smoke.yaml")
    for given in ([f"--config={smoke}"], [f"-c={smoke}"], ["-c", smoke]):
        assert with_default_profile(["test", *given], ["fit", "test"]) == (["test", *given],
                                                                           False)
    # a config before the subcommand holds the subcommand's keys under its name
    top = tmp_path / "top.yaml"
    top.write_text("fit:\n  trainer:\n    max_steps: 5\n")
    assert not with_default_profile(["--config", str(top), "fit"], ["fit"])[1]
    # no subcommand (the sweeps parse so): left alone
    assert with_default_profile(["--config", size], ["fit"]) == (["--config", size], False)
