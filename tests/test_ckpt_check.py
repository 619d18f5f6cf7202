"""Checkpoints are read as tensors only (``arbench.ckpt_check``): one whose unpickling would run
code is refused with one line on every path ``main.py`` loads one, and its code never runs."""

import pytest
import torch
from hostile import hostile_checkpoint
from test_errors import FAST, P4, one_error

from arbench.checks import CliError
from arbench.ckpt_check import read_checkpoint
from arbench.cli import run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step smoke fit of p4: its run folder."""
    folder = tmp_path_factory.mktemp("trained")
    run(["fit", *P4, *FAST, f"--trainer.logger.init_args.save_dir={folder}"])
    return folder


def test_the_payload_is_live_when_loaded_without_the_guard(tmp_path):
    """The test's hostile file does run code under a plain unpickling: the guard is what
    stops it."""
    path = hostile_checkpoint(tmp_path / "evil.ckpt", tmp_path / "MARKER")
    torch.load(path, weights_only=False)
    assert (tmp_path / "MARKER").exists()


def test_read_checkpoint_refuses_code_in_one_line(tmp_path):
    path = hostile_checkpoint(tmp_path / "evil.ckpt", tmp_path / "MARKER")
    with pytest.raises(CliError) as err:
        read_checkpoint(str(path), "--ckpt_path")
    message = str(err.value)
    assert message.startswith(f"--ckpt_path {path} refused: it holds an object other than")
    assert "io.open" in message and "\n" not in message
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("subcommand,option", [
    ("fit", "--ckpt_path"), ("test", "--ckpt_path"), ("fit", "--model.init_from")])
def test_main_refuses_a_hostile_checkpoint(in_tmp, capsys, trained, subcommand, option):
    marker = in_tmp / "MARKER"
    path = hostile_checkpoint(in_tmp / "evil.ckpt", marker,
                              base=trained / "p4" / "checkpoints" / "last.ckpt")
    line = one_error(capsys, [subcommand, *P4, *FAST, option, str(path),
                              f"--trainer.logger.init_args.save_dir={in_tmp / 'runs'}"])
    assert "evil.ckpt refused: it holds an object other than tensors" in line
    assert not marker.exists()


def test_resuming_last_refuses_a_hostile_last_ckpt(in_tmp, capsys, trained):
    """``--ckpt_path last`` finds the run's own ``last.ckpt``, replaced by a hostile one."""
    runs = in_tmp / "runs"
    checkpoints = runs / "p4" / "checkpoints"
    checkpoints.mkdir(parents=True)
    hostile_checkpoint(checkpoints / "last.ckpt", in_tmp / "MARKER",
                       base=trained / "p4" / "checkpoints" / "last.ckpt")
    line = one_error(capsys, ["fit", *P4, *FAST, "--ckpt_path", "last",
                              f"--trainer.logger.init_args.save_dir={runs}"])
    assert "last.ckpt refused" in line
    assert not (in_tmp / "MARKER").exists()


def test_weights_only_false_is_refused(in_tmp, capsys, trained):
    line = one_error(capsys, ["fit", *P4, *FAST, "--weights_only", "false", "--ckpt_path",
                              str(trained / "p4" / "checkpoints" / "last.ckpt")])
    assert line.startswith("error: --weights_only false would let a checkpoint run code")


def test_lightnings_own_resume_loads_tensors_only(in_tmp, trained):
    """Below arbench's check: Lightning's ``fit(ckpt_path=...)`` with its default
    ``weights_only`` (None: torch's default, True) refuses the payload too, as does the
    sweeps worker's explicit ``weights_only=True``."""
    import pickle

    from arbench.cli import build_cli

    marker = in_tmp / "MARKER"
    path = hostile_checkpoint(in_tmp / "evil.ckpt", marker,
                              base=trained / "p4" / "checkpoints" / "last.ckpt")
    cli = build_cli([*P4, *FAST, f"--trainer.logger.init_args.save_dir={in_tmp / 'runs'}"],
                    run=False)
    for weights_only in (None, True):
        with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(path),
                            weights_only=weights_only)
    assert not marker.exists()
