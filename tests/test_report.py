"""The end-of-run report: every fit, validate and test (and a fit stopped by Ctrl-C) ends with
what it found, and names files that exist."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from paths import ROOT, SMOKE, config

from arbench.cli import run
from arbench.report import RunResult, format_report

NO_BAR = ["--trainer.enable_progress_bar", "false"]


class SigintAtStep(L.Callback):
    """Sends this process a real SIGINT (Ctrl-C) after training step ``step``."""

    def __init__(self, step: int = 13):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


class SigtermAtStep(L.Callback):
    """Sends this process a real SIGTERM (``kill <pid>``) after training step ``step``."""

    def __init__(self, step: int = 1):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main(*args: str):
    return run([args[0], "--config", config("p4.yaml"), *SMOKE, *args[1:]])


def report_of(out: str) -> list[str]:
    """The report's lines: from the last ``result of`` line to the end of stdout."""
    start = out.rindex("result of ")
    return out[start:].strip().splitlines()


def percent(value: float) -> str:
    return f"{100 * value:.2f} %"


def named_paths(lines: list[str]) -> dict[str, str]:
    """``label -> path`` of the lines that name a file or folder."""
    found = {}
    for line in lines:
        match = re.match(r"\s+(run folder|summary|best checkpoint|last checkpoint|"
                         r"checkpoint evaluated): (\S+)", line)
        if match and not line.strip().startswith("summary: none"):
            found[match.group(1)] = match.group(2)
        match = re.match(r"\s+see it: tensorboard --logdir (\S+)$", line)
        if match:
            found["tensorboard"] = match.group(1)
    return found


def test_fit_ends_with_what_it_found(in_tmp, capsys):
    main("fit", *NO_BAR)
    out = capsys.readouterr().out
    lines = report_of(out)
    summary = json.loads((in_tmp / "runs/p4/version_0/summary.json").read_text())
    assert lines[0] == "result of fit (runs/p4/version_0): finished at step 20"
    assert summary["finished"] and summary["stopped_by"] is None
    acc = next(line for line in lines if line.strip().startswith("val/acc "))
    assert (f"best {percent(summary['val_acc'])} at step {int(summary['best_step'])}, "
            f"last {percent(summary['last_val_acc'])}") in acc
    for name, value in summary["slices"].items():
        row = next(line for line in lines if line.strip().startswith(name + " "))
        assert row.split()[1:3] == percent(value).split()  # the best column
    converged = next(line for line in lines if "converged" in line)
    assert converged.split(": ")[1].startswith("yes" if summary["converged"] else "no")
    collapsed = "no" if summary["collapsed_at"] is None else f"yes, at step {summary['collapsed_at']}"
    assert any(line.startswith(f"  collapsed: {collapsed}") for line in lines)
    assert any(line.startswith("  speed: ") and "tokens trained" in line for line in lines)
    paths = named_paths(lines)
    assert paths["summary"] == "runs/p4/version_0/summary.json"
    assert paths["best checkpoint"] == summary["best_checkpoint"]
    assert paths["last checkpoint"] == summary["last_checkpoint"]
    assert paths["tensorboard"] == paths["run folder"] == summary["log_dir"]
    assert all(Path(p).exists() for p in paths.values())
    assert out.rstrip().endswith(f"tensorboard --logdir {summary['log_dir']}")


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_evaluation_ends_with_what_it_found(in_tmp, capsys, subcommand):
    main("fit", "--trainer.max_steps", "10", *NO_BAR)
    capsys.readouterr()
    ckpt = "runs/p4/checkpoints/last.ckpt"
    cli = main(subcommand, "--ckpt_path", ckpt)  # with the progress bar
    out = capsys.readouterr().out
    lines = report_of(out)
    prefix = "test" if subcommand == "test" else "val"
    metrics = cli.trainer.callback_metrics
    step = torch.load(ckpt, weights_only=False)["global_step"]
    assert lines[0] == (f"result of {subcommand} (runs/p4/version_1): finished "
                        f"(the model of training step {step})")
    for metric in ("acc", "example_acc"):  # per answer token, and zoology's per example
        row = next(line for line in lines if line.split()[:1] == [f"{prefix}/{metric}"])
        assert row.split()[1:] == percent(float(metrics[f"{prefix}/{metric}"])).split()
    for name in cli.model.slice_names:
        row = next(line for line in lines if line.strip().startswith(name + " "))
        assert row.split()[1:] == percent(float(metrics[f"{prefix}/acc_{name}"])).split()
    assert any(line.startswith("  converged (the training, from the checkpoint): ")
               for line in lines)
    assert any("tokens evaluated" in line for line in lines)
    paths = named_paths(lines)
    assert paths["checkpoint evaluated"] == ckpt and f"{ckpt} (step {step})" in out
    assert paths["tensorboard"] == paths["run folder"] == "runs/p4/version_1"
    assert ("summary" in paths) == (subcommand == "validate")
    assert all(Path(p).exists() for p in paths.values())
    assert out.rstrip().endswith("tensorboard --logdir runs/p4/version_1")


@pytest.mark.parametrize("step,validated", [(13, True), (3, False)])
def test_ctrl_c_ends_with_what_the_fit_reached(in_tmp, capsys, step, validated):
    handler = signal.getsignal(signal.SIGINT)
    # Python's own Ctrl-C handler, also where this process inherited SIGINT ignored (a job
    # started in the background by a non-interactive shell, e.g. `nohup bash .ci/run &`)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exc:  # Lightning exits 1 after a KeyboardInterrupt
            main("fit", "--trainer.callbacks+=test_report.SigintAtStep",
                 f"--trainer.callbacks.init_args.step={step}")
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT from then on
    assert exc.value.code == 1
    lines = report_of(capsys.readouterr().out)
    assert lines[0] == f"result of fit (runs/p4/version_0): stopped by Ctrl-C at step {step}"
    paths = named_paths(lines)
    assert all(Path(p).exists() for p in paths.values())
    assert paths["tensorboard"] == "runs/p4/version_0"
    if validated:
        summary = json.loads(Path(paths["summary"]).read_text())
        assert not summary["finished"] and summary["best_step"] == 10
        assert summary["stopped_by"] == "Ctrl-C"
        assert f"best {percent(summary['val_acc'])} at step 10" in "\n".join(lines)
        assert paths["best checkpoint"] == summary["best_checkpoint"]
    else:
        assert "  val/acc: no evaluation reached" in lines
        assert "  summary: none (no validation was made)" in lines
        assert not any("checkpoint" in label for label in paths)


def test_other_accuracies_print_beside_val_acc_but_not_as_slices():
    best = {"val/acc": 0.5, "val/acc_L64_N8": 0.75, "val/example_acc": 0.25, "step": 250.0,
            "example_step": 500.0, "val/example_acc_L64_N8": 0.25}
    last = {"val/acc": 0.375, "val/acc_L64_N8": 0.5, "val/example_acc": 0.125, "step": 500.0}
    text = format_report(RunResult(
        stage="fit", interrupted=False, step=500, prefix="val", best=best, last=last,
        slices=["L64_N8"], converged=False, collapsed_at=300, wall_time_s=130.0,
        process_s=30.0, tokens=64_000, log_dir=None))
    lines = text.splitlines()
    assert "  val/example_acc  best 25.00 % at step 500, last 12.50 %" in lines
    assert not any(line.strip().startswith("examples") for line in lines)
    assert "  L64_N8    75.00 %    50.00 %" in lines
    assert any("yes, at step 300" in line for line in lines)
    assert "  wall time: 130 s (2.2 min), 30 s of it in this process (resumed)" in lines
    assert "  speed: 2,133 tokens/s (64,000 tokens trained in 30 s, validations included)" \
        in lines


@pytest.mark.parametrize("step", [1, 13])
def test_sigterm_ends_with_what_the_fit_reached(in_tmp, step):
    """``kill <pid>`` stops the fit like Ctrl-C: a report that says so and a non-zero exit;
    after a validation, ``summary.json`` says so too."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "fit", "--config", config("p4.yaml"), *SMOKE,
         *NO_BAR, "--trainer.max_steps", "50", "--trainer.callbacks+=test_report.SigtermAtStep",
         f"--trainer.callbacks.init_args.step={step}"],
        capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = report_of(proc.stdout)
    assert lines[0] == f"result of fit (runs/p4/version_0): stopped by SIGTERM at step {step}"
    summary_file = in_tmp / "runs/p4/version_0/summary.json"
    if step == 1:
        assert "  val/acc: no evaluation reached" in lines
        assert not summary_file.exists()
    else:
        summary = json.loads(summary_file.read_text())
        assert not summary["finished"] and summary["stopped_by"] == "SIGTERM"
        assert summary["best_step"] == 10 and summary["global_step"] == step


def test_stopped_by_names_what_stopped_the_run():
    result = RunResult(stage="fit", interrupted=True, step=7, prefix="val", best={}, last={},
                       slices=[], converged=None, collapsed_at=None, wall_time_s=1.0,
                       process_s=1.0, tokens=0, stopped_by="SIGTERM")
    assert format_report(result).startswith("result of fit: stopped by SIGTERM at step 7")
