"""Bad input a new user hits: one ``error:`` line, a non-zero exit, nothing written (issue #16).

Each test names the issue's case it covers. CLI cases run in-process through ``run()``; the
noise checks run ``main.py`` in a subprocess (pytest would capture the warnings otherwise).
"""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from paths import ROOT, SMOKE, config

from arbench.cli import run

P4 = ["--config", config("p4.yaml"), *SMOKE]
FAST = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false"]


def one_error(capsys, args: list[str]) -> str:
    """Run the CLI, expect a non-zero exit and exactly one ``error:`` line; return it."""
    with pytest.raises(SystemExit) as exc:
        run(args)
    assert exc.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert len(err.strip().splitlines()) <= 3, err  # at most a pointer to --help besides
    return lines[0]


@pytest.fixture(scope="module")
def p4_ckpt(tmp_path_factory) -> Path:
    """``last.ckpt`` of a 2-step smoke fit of p4 (vocab 64, d_model 32)."""
    folder = tmp_path_factory.mktemp("trained")
    run(["fit", *P4, *FAST, f"--trainer.logger.init_args.save_dir={folder}"])
    return folder / "p4" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def based_ckpt(tmp_path_factory) -> Path:
    """``last.ckpt`` of a 2-step smoke fit of BASED."""
    folder = tmp_path_factory.mktemp("based")
    run(["fit", "--config", config("based.yaml"), *SMOKE, *FAST,
         f"--trainer.logger.init_args.save_dir={folder}"])
    return folder / "based" / "checkpoints" / "last.ckpt"


# ---- case 1, 2: a checkpoint must match the configuration ----------------------------------
def test_ckpt_of_another_method_is_refused(in_tmp, capsys, p4_ckpt):
    line = one_error(capsys, ["test", "--config", config("based.yaml"), *SMOKE,
                              "--ckpt_path", str(p4_ckpt)])
    assert "model.feature_map.class_path=arbench.featuremaps.LLoPS" in line
    assert "the config has arbench.featuremaps.Based" in line
    assert not (in_tmp / "runs").exists()


def test_ckpt_with_explicit_flags_names_each_key(in_tmp, capsys, p4_ckpt):
    line = one_error(capsys, ["test", *P4, "--ckpt_path", str(p4_ckpt),
                              "--model.feature_map.init_args.p", "6", "--model.d_model", "64"])
    assert "model.feature_map.init_args.p=4 (the config has 6)" in line
    assert "model.d_model=32 (the config has 64)" in line
    assert not (in_tmp / "runs").exists()


def test_readme_test_command_with_another_profile(in_tmp, capsys, p4_ckpt):
    line = one_error(capsys, ["test", "--config", config("p4.yaml"), "--config",
                              config("profiles/cpu.yaml"), "--ckpt_path", str(p4_ckpt)])
    assert "model.vocab_size=64 (the config has 512)" in line
    assert not (in_tmp / "runs").exists()


def test_matching_ckpt_still_tests(in_tmp, capsys, p4_ckpt, recwarn):
    """A checkpoint from another folder tests, with no error and without Lightning's "The
    dirpath has changed" (testing never saves checkpoints)."""
    run(["test", *P4, "--ckpt_path", str(p4_ckpt), "--trainer.limit_test_batches", "1",
         "--trainer.enable_progress_bar", "false", "--model.lr", "0.5"])  # lr: training only
    assert "error" not in capsys.readouterr().err
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]


# ---- case 5: missing or corrupt checkpoint -------------------------------------------------
def test_missing_ckpt(in_tmp, capsys):
    line = one_error(capsys, ["test", *P4, "--ckpt_path", "runs/p4/checkpoints/nope.ckpt"])
    assert line == "error: --ckpt_path runs/p4/checkpoints/nope.ckpt: no such file"
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("content", [b"not a checkpoint\n", b"PK\x03\x04truncated"])
def test_corrupt_ckpt(in_tmp, capsys, content):
    (in_tmp / "bad.ckpt").write_bytes(content)
    line = one_error(capsys, ["test", *P4, "--ckpt_path", "bad.ckpt"])
    assert line.startswith("error: --ckpt_path bad.ckpt is not a readable checkpoint (")
    assert not (in_tmp / "runs").exists()


# ---- case 7 (fit), 8, 9: outputs, memory, trainer values -----------------------------------
def test_unwritable_logger_dir(in_tmp, capsys):
    (in_tmp / "file").write_text("")
    line = one_error(capsys, ["fit", *P4, "--trainer.logger.init_args.save_dir", "file/runs"])
    assert "--trainer.logger.init_args.save_dir file/runs: cannot write there" in line
    assert "is not a folder" in line


def test_model_too_large_for_memory(in_tmp, capsys):
    line = one_error(capsys, ["fit", *P4, "--model.feature_map.init_args.m", "1000000000"])
    assert "the model does not fit in memory: its parameters alone take" in line
    assert "GiB, this machine has" in line
    assert not (in_tmp / "runs").exists()


def test_negative_max_steps(in_tmp, capsys):
    line = one_error(capsys, ["fit", *P4, "--trainer.max_steps", "-5"])
    assert "`max_steps` must be a non-negative integer" in line


# ---- case 11, 12: config files and parser errors -------------------------------------------
def test_empty_config_file(in_tmp, capsys):
    (in_tmp / "empty.yaml").write_text("")
    line = one_error(capsys, ["fit", *P4, "--config", "empty.yaml"])
    assert line == "error: config file empty.yaml is empty (or holds only comments)"


def test_invalid_yaml_names_the_file(in_tmp, capsys):
    (in_tmp / "bad.yaml").write_text("model:\n  d_model: [1,\n")
    line = one_error(capsys, ["fit", *P4, "--config", "bad.yaml"])
    assert line.startswith("error: config file bad.yaml is not valid YAML: ")
    assert "line 3, column 1" in line and "unicode string" not in line


@pytest.mark.parametrize("args,expected", [
    (["--model.feature_map.init_args.p", "2.5"],
     "error: model.feature_map.init_args.p: expected an integer, got 2.5"),
    (["--model.feature_map.class_path", "nosuch.Map"],
     "error: model.feature_map: cannot import class_path nosuch.Map (No module named 'nosuch')"),
    (["--model.feature_map.init_args.zz", "1"],
     "error: model.feature_map.init_args.zz: no such option of arbench.featuremaps.LLoPS"),
    (["--model.lr", "nan"], "error: model.lr must be a finite number, got nan"),
    (["--model.d_model", "abc"], "error: model.d_model: expected an integer, got abc"),
    (["--seed_everything", "x"], "error: seed_everything: expected true or false or an integer, "
                                 "got x"),
    (["--data.test_segments", "foo"], "error: data.test_segments: expected a list, got foo"),
    (["--data.test_segments", "[]"],
     "error: invalid configuration: data.test_segments must list at least one segment"),
])
def test_parser_errors_are_one_line(in_tmp, capsys, args, expected):
    assert one_error(capsys, ["fit", *P4, *args]) == expected
    assert not (in_tmp / "runs").exists()


# ---- case 13: --ckpt_path last with nothing to resume --------------------------------------
def test_resume_with_nothing_to_resume_says_so(in_tmp, capsys):
    cli = run(["fit", *P4, *FAST, "--trainer.max_steps", "1", "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert "note: --ckpt_path last: nothing to resume in runs/p4/checkpoints; starting fresh" \
        in err
    assert cli.trainer.global_step == 1


# ---- case 4: summary.json names checkpoints that exist -------------------------------------
class Interrupt(Callback):
    """Ctrl-C right after the first validation (and its checkpoints)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= 2:
            raise KeyboardInterrupt


def test_summary_of_an_interrupted_run_names_existing_checkpoints(in_tmp):
    with pytest.raises(SystemExit):
        run(["fit", *P4, *FAST, "--trainer.max_steps", "10", "--trainer.callbacks+",
             "test_errors.Interrupt"])
    summary = json.loads((in_tmp / "runs/p4/version_0/summary.json").read_text())
    assert summary["best_checkpoint"] and summary["last_checkpoint"]
    assert Path(summary["best_checkpoint"]).exists() and Path(summary["last_checkpoint"]).exists()
    assert Path(summary["best_checkpoint"]).name == "best-step=2.ckpt"
    assert not summary["finished"]


# ---- case 14: no library noise on a normal run and its resume ------------------------------
def test_smoke_fit_and_resume_print_no_library_noise(in_tmp):
    base = [sys.executable, str(ROOT / "main.py"), "fit", *P4, "--trainer.max_steps", "3",
            "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false"]
    first = subprocess.run(base, capture_output=True, text=True, timeout=120, cwd=in_tmp)
    again = subprocess.run([*base, "--trainer.max_steps", "5", "--ckpt_path", "last"],
                           capture_output=True, text=True, timeout=120, cwd=in_tmp)
    assert first.returncode == 0 and again.returncode == 0, again.stderr
    assert torch.load(in_tmp / "runs/p4/checkpoints/last.ckpt",
                      weights_only=False)["global_step"] == 5
    for out in (first, again):
        text = out.stdout + out.stderr
        for noise in ("LeafSpec", "litlogger", "not resumable", "exists and is not empty",
                      "Warning", "warn("):
            assert noise not in text, text


# ---- case 7 (approx, bench), 10: outputs checked before any work, one-line bench errors ----
def test_approx_unwritable_out_before_any_work(in_tmp, capsys):
    from arbench.approx.cli import main

    (in_tmp / "file").write_text("")
    assert main(["--synthetic", "--out", "file/approx", "--steps", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was fitted
    assert captured.err.strip() == ("error: --out file/approx: cannot write there "
                                    f"({in_tmp / 'file'} is not a folder)")


@pytest.mark.parametrize("argv,needle", [
    (["--out", "file/bench"], "error: --out file/bench: cannot write there"),
    (["--methods", "nosuch"], "error: unknown methods ['nosuch']; choose from ['llops_p2_t1'"),
])
def test_bench_bad_input_before_any_work(in_tmp, capsys, argv, needle):
    from arbench.bench.__main__ import main

    (in_tmp / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["--smoke", *argv])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith(needle)


# ---- case 16: bench --smoke output is ignored by git ---------------------------------------
def test_bench_smoke_output_is_git_ignored():
    out = subprocess.run(["git", "check-ignore", "-q", "results/bench_smoke/bench.md"],
                         cwd=ROOT, capture_output=True)
    assert out.returncode == 0


ARGPARSE_CLIS = {  # module with main(argv), a bad argument list, the prog its message names
    "arbench.approx.cli": (["--p", "x"], "python -m arbench.approx"),
    "arbench.bench.__main__": (["--smoke=yes"], "python -m arbench.bench"),
    "arbench.bench.profile": (["--no-such-flag"], "python -m arbench.bench.profile"),
    "arbench.bench.grad_precision": (["--no-such-flag"], "python -m arbench.bench.grad_precision"),
    "arbench.bench.device_check": (["--no-such-flag"], "scripts/device_check.sh"),
    "arbench.data.benchmark": (["--no-such-flag"], "--help"),
    "sweeps.__main__": (["frob"], "python -m sweeps"),
    "sweeps.same_computation": ([], "python -m sweeps.same_computation"),
}


@pytest.mark.parametrize("module", sorted(ARGPARSE_CLIS))
def test_argparse_clis_report_a_usage_error_in_one_line(capsys, module):
    """The argparse CLIs print one ``error:`` line naming ``--help``, not the usage dump."""
    argv, prog = ARGPARSE_CLIS[module]
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "usage:" not in err and prog in err and "--help" in err


# ---- bad values found before the run folder is written --------------------------------------
@pytest.mark.parametrize("value", ["0", "-2", "-0.5"])
def test_non_positive_val_check_interval(in_tmp, capsys, value):
    line = one_error(capsys, ["fit", *P4, "--trainer.val_check_interval", value])
    assert line == ("error: --trainer.val_check_interval must be > 0 (training steps, or a "
                    f"fraction of an epoch), got {value}")
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("subcommand", ["test", "validate"])
def test_ckpt_path_best_without_a_fit(in_tmp, capsys, subcommand):
    line = one_error(capsys, [subcommand, *P4, "--ckpt_path", "best"])
    assert line == ("error: --ckpt_path best needs a fit in this process; give a checkpoint "
                    "file or `last`")
    assert not (in_tmp / "runs").exists()


def test_predict_is_not_a_subcommand(in_tmp, capsys):
    line = one_error(capsys, ["predict", *P4])
    assert "invalid choice: 'predict' (choose from 'fit', 'validate', 'test')" in line
    assert not (in_tmp / "runs").exists()


def test_init_from_and_positions_fail_before_the_run_folder(in_tmp, capsys, p4_ckpt,
                                                            based_ckpt):
    cases = [
        (["--model.init_from", "nope.ckpt"], "error: init_from: no checkpoint at nope.ckpt"),
        (["--model.init_from", str(p4_ckpt), "--model.d_model", "64"],
         "error: init_from: embed.weight is (64, 32) in the checkpoint and (64, 64) here"),
        (["--model.init_from", str(based_ckpt)], "embedding it needs an affine rank-1 LLoPS map"),
        (["--model.max_position_embeddings", "16"],
         "error: a sequence of 64 tokens is longer than model.max_position_embeddings=16"),
    ]
    for args, needle in cases:
        for subcommand in ("fit", "test"):
            assert needle in one_error(capsys, [subcommand, *P4, *args]), args
            assert not (in_tmp / "runs").exists(), (subcommand, args)
