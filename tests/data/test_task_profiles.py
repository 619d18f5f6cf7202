"""The recall variants end to end: each task's smoke profile (configs/tasks/) trains with a
method config and the tiny size, reports accuracy per slice, and bad task settings stop with
one line, also through ``python main.py fit``."""

import subprocess
import sys

import pytest
import torch
import yaml
from paths import ROOT, config
from test_errors import one_error

from arbench.cli import run
from arbench.data import Segment
from arbench.data.datamodule import MQARDataModule

TASK_PROFILES = sorted((ROOT / "configs" / "tasks").glob("*_smoke.yaml"))
TINY = ["--config", config("sizes/tiny.yaml")]


def test_every_task_has_a_smoke_profile_shaped_like_smoke():
    tasks = {p.name.removesuffix("_smoke.yaml") for p in TASK_PROFILES}
    assert tasks == {"overwrite", "noisy_recall", "fuzzy_recall", "selective_copying"}
    smoke = yaml.safe_load((ROOT / "configs/profiles/smoke.yaml").read_text())
    for path in TASK_PROFILES:
        raw = yaml.safe_load(path.read_text())
        assert set(raw) == {"data", "trainer"} and raw["trainer"] == smoke["trainer"]
        segments = raw["data"]["train_segments"] + raw["data"]["test_segments"]
        assert {s["task"] for s in segments} == {path.name.removesuffix("_smoke.yaml")}


@pytest.mark.parametrize("path", TASK_PROFILES, ids=lambda p: p.stem)
def test_task_trains_at_smoke_size_with_per_slice_accuracy(in_tmp, path):
    cli = run(["fit", "--config", config("p4.yaml"), "--config", str(path), *TINY,
               "--trainer.max_steps", "10", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 10
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and 0 <= float(metrics["val/acc"]) <= 1
    names = cli.datamodule.slice_names
    prefix = {"overwrite": "ow_", "noisy_recall": "noisy_", "fuzzy_recall": "fuzzy_",
              "selective_copying": "copy_"}[path.name.removesuffix("_smoke.yaml")]
    assert len(names) == 2 and all(n.startswith(prefix) for n in names)
    for name in names:
        assert 0 <= float(metrics[f"val/acc_{name}"]) <= 1


def test_a_later_segment_list_replaces_the_earlier_one_whole(capsys):
    """A list as long as the profile's keeps nothing of it (no task or setting merged in)."""
    with pytest.raises(SystemExit):
        run(["fit", "--config", config("p4.yaml"), "--config",
             config("tasks/overwrite_smoke.yaml"), *TINY, "--config", config("profiles/smoke.yaml"),
             "--data.test_segments", "[{task: selective_copying, seq_len: 32, "
             "num_tokens_to_copy: 4, num_examples: 8}, {seq_len: 64, num_kv_pairs: 8, "
             "num_examples: 8}]", "--print_config"])
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data["train_segments"] == [{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 512}]
    assert data["test_segments"] == [
        {"task": "selective_copying", "seq_len": 32, "num_tokens_to_copy": 4, "num_examples": 8},
        {"seq_len": 64, "num_kv_pairs": 8, "num_examples": 8}]


def test_task_data_is_cached_apart_from_mqar(tmp_path):
    noisy = Segment(32, num_examples=8, task="noisy_recall", noise_fraction=0.2,
                    noise_vocab_size=8)
    dms = [MQARDataModule(vocab_size=64, train_segments=[seg], test_segments=[seg],
                          cache_dir=str(tmp_path)) for seg in (Segment(32, 4, 8), noisy)]
    for dm in dms:
        dm.setup("fit")
    assert len(list(tmp_path.glob("*.pt"))) == 4  # train and test of each: no key shared
    again = MQARDataModule(vocab_size=64, train_segments=[noisy], test_segments=[noisy],
                           cache_dir=str(tmp_path))
    again.setup("fit")
    assert torch.equal(again._test.data[0].labels, dms[1]._test.data[0].labels)


OVERWRITE = "{task: overwrite, seq_len: 32, num_kv_pairs: 4, num_examples: 8, num_updates: "
NOISY = "{task: noisy_recall, seq_len: 32, num_examples: 8, noise_vocab_size: 8, noise_fraction: "


@pytest.mark.parametrize("segments,expected", [
    (f"[{OVERWRITE}5}}]", "data.test_segments[0]: num_updates=5 exceeds num_kv_pairs=4 "
                          "(each update reassigns a different key)"),
    (f"[{NOISY}1.0}}]", "data.test_segments[0]: noise_fraction must be a number in [0, 1), "
                        "got 1.0"),
    ("[{task: overwrite, seq_len: 16, num_kv_pairs: 4, num_updates: 2, num_examples: 8}]",
     "data.test_segments[0]: seq_len=16 is too short for num_kv_pairs=4 with num_updates=2"),
    ("[{task: fuzzy_recall, seq_len: 32, max_key_len: 40, max_value_len: 1, num_examples: 8}]",
     "data.test_segments[0]: seq_len=32 is too short"),
    ("[{task: selective_copying, seq_len: 32, num_tokens_to_copy: 4, num_examples: 8}, "
     "{task: selective_copying, seq_len: 64, num_tokens_to_copy: 4, num_examples: 8}, "
     "{task: selective_copying, seq_len: 32, num_tokens_to_copy: 4, num_examples: 9}]",
     "data.test_segments[2]: slice copy_L32_T4 is already data.test_segments[0]"),
    ("[{seq_len: 32, num_kv_pairs: 4, num_examples: 8, nope: 1}]",
     "data.test_segments: Unexpected keys: {'nope'}"),
    ("[{task: overwrite, seq_len: 32, num_kv_pairs: 4, num_updates: x, num_examples: 8}]",
     "data.test_segments: expected an integer, got x"),
    ("[{seq_len: 32, num_kv_pairs: 4, num_examples: 8, noise_fraction: 0.1}]",
     "data.test_segments[0]: noise_fraction does not apply to task mqar"),
])
def test_bad_task_settings_one_line(in_tmp, capsys, segments, expected):
    line = one_error(capsys, ["fit", "--config", config("p4.yaml"), "--config",
                              config("profiles/smoke.yaml"), *TINY, "--data.test_segments",
                              segments])
    assert line.startswith((f"error: invalid configuration: {expected}",
                            f"error: {expected}")), line
    assert not (in_tmp / "runs").exists()


def test_bad_task_settings_one_line_through_main(in_tmp):
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "fit", "--config",
                           config("p4.yaml"), "--config",
                           config("tasks/overwrite_smoke.yaml"), *TINY,
                           "--data.vocab_size", "8"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: invalid configuration: data.train_segments[0]: num_kv_pairs=4 "
                      "exceeds the 3 distinct keys of vocab_size=8 (keys come from "
                      "[1, vocab_size//2))"], proc.stderr
