import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import ROOT, config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from arbench.cli import run

SMOKE = config("profiles/smoke.yaml")
ALL_CONFIGS = ["p2.yaml", "p4.yaml", "p6.yaml", "based.yaml", "flatten.yaml", "polysketch.yaml",
               "softmax.yaml", "rank.yaml", "teacher.yaml", "deltanet.yaml",
               "gated_deltanet.yaml", "elu.yaml", "zoology_based.yaml", "zoology_p4.yaml"]
PROFILES = ["profiles/smoke.yaml", "profiles/cpu.yaml", "profiles/paper.yaml"]


def scalars(version_dir: Path) -> dict[str, list]:
    acc = EventAccumulator(str(version_dir))
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def test_fit_smoke_writes_tensorboard_and_resumes(in_tmp):
    run(["fit", "--config", config("p4.yaml"), "--config", SMOKE, "--trainer.max_steps", "10",
         "--trainer.enable_progress_bar", "false"])
    first = scalars(in_tmp / "runs/p4/version_0")
    assert "val/acc" in first and "train/loss" in first
    assert any(tag.startswith("val/acc_L32_N4") for tag in first)
    assert (in_tmp / "runs/p4/version_0/config.yaml").exists()
    saved = (in_tmp / "runs/p4/version_0/config.yaml").read_text()
    assert "seed_everything: 0" in saved
    last = in_tmp / "runs/p4/checkpoints/last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 10

    cli = run(["fit", "--config", config("p4.yaml"), "--config", SMOKE, "--trainer.max_steps",
               "20", "--ckpt_path", "last", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 20
    second = scalars(in_tmp / "runs/p4/version_1")
    assert min(e.step for e in second["train/loss"]) >= 10  # continued, not restarted
    # HParams tab: the plugin data is written into the run's event file.
    raw = b"".join(p.read_bytes() for p in (in_tmp / "runs/p4/version_1").glob("events*"))
    assert b"hparams" in raw and b"feature_map" in raw and b"state_size" in raw


@pytest.mark.parametrize("mixer,layer", [("gated", "GatedLinearAttention"),
                                         ("delta", "DeltaAttention"),
                                         ("gated_delta", "DeltaAttention")])
def test_fit_smoke_state_mixers(in_tmp, mixer, layer):
    cli = run(["fit", "--config", config("p4.yaml"), "--config", SMOKE, "--model.mixers",
               f"[conv, {mixer}]", "--trainer.max_steps", "10",
               "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 10
    assert type(cli.model.model.blocks[1].mixer).__name__ == layer
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and "val/acc" in metrics
    assert (in_tmp / "runs/p4/checkpoints/last.ckpt").exists()


def test_smoke_model_learns_easy_recall(in_tmp):
    cli = run(["fit", "--config", config("softmax.yaml"), "--config", SMOKE,
               "--data.train_segments", '[{"seq_len": 32, "num_kv_pairs": 4, '
               '"num_examples": 4096}]', "--data.test_segments",
               '[{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 256}]',
               "--trainer.max_steps", "400", "--trainer.val_check_interval", "400",
               "--model.lr", "3e-3", "--trainer.enable_progress_bar", "false"])
    acc = float(cli.trainer.callback_metrics["val/acc"])
    assert acc > 0.5, acc  # chance is 1/32 over the value half of a 64-token vocabulary


@pytest.mark.parametrize("name", ALL_CONFIGS + PROFILES)
def test_every_config_parses(name, capsys):
    with pytest.raises(SystemExit) as exc:
        run(["fit", "--config", config(name), "--print_config"])
    assert exc.value.code == 0
    assert "model:" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--model.foo", "1"], "model.foo"),
    (["--model.d_model", "abc"], "model.d_model"),
    (["--model.feature_map.init_args.p", "0"], "p must be an integer >= 1, got 0"),
    (["--model.feature_map.init_args.m", "-3"], "m must be an integer >= 1, got -3"),
    (["--model.num_heads", "3"], "not divisible by num_heads=3"),
    (["--model.mixers", "[conv, mamba]"], "mixers must be a non-empty list of"),
    (["--model.mixers", "[conv, delta]", "--model.normalize", "signed"],
     "the delta rule has no denominator"),
    (["--data.train_segments", '[{"seq_len": 16, "num_kv_pairs": 8, "num_examples": 4}]'],
     "data.train_segments[0]: seq_len=16 is too short for num_kv_pairs=8"),
])
def test_bad_config_one_clear_line(in_tmp, args, needle):
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "fit", "--config",
                           config("p4.yaml"), "--config", SMOKE, *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert len(error_lines) == 1, proc.stderr


def _val_acc(stdout: str) -> float:
    match = re.search(r"val/acc\s*│?\s*([0-9.]+)", stdout)
    assert match, stdout
    return float(match.group(1))


def test_ddp_two_cpu_processes_same_validation_accuracy(in_tmp):
    base = [sys.executable, str(ROOT / "main.py")]
    cfg = ["--config", config("p2.yaml"), "--config", SMOKE, "--trainer.enable_progress_bar",
           "false"]
    subprocess.run(base + ["fit", *cfg, "--trainer.max_steps", "30", "--trainer.strategy", "ddp",
                           "--trainer.devices", "2"], check=True, capture_output=True, timeout=300)
    ckpt = str(in_tmp / "runs/p2/checkpoints/last.ckpt")
    assert torch.load(ckpt, weights_only=False)["global_step"] == 30
    one = subprocess.run(base + ["validate", *cfg, "--ckpt_path", ckpt], check=True,
                         capture_output=True, text=True, timeout=300)
    two = subprocess.run(base + ["validate", *cfg, "--ckpt_path", ckpt, "--trainer.strategy",
                                 "ddp", "--trainer.devices", "2"], check=True,
                         capture_output=True, text=True, timeout=300)
    assert _val_acc(one.stdout) == pytest.approx(_val_acc(two.stdout), abs=1e-6)
