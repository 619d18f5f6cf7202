"""``last.ckpt`` follows every validation, also when the monitored val/acc did not improve."""

import pytest
import torch
from paths import SMOKE, config

from arbench.cli import run


def test_last_checkpoint_is_the_run_s_end_when_val_acc_stalls(in_tmp):
    # lr 1e-12: val/acc never moves, so only the first validation saves a best checkpoint
    run(["fit", "--config", config("p4.yaml"), *SMOKE, "--model.lr", "1e-12",
         "--trainer.enable_progress_bar", "false"])
    ckpts = in_tmp / "runs/p4/checkpoints"
    assert [p.name for p in ckpts.glob("best-*.ckpt")] == ["best-step=10.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == 20


def test_last_checkpoint_follows_validations_once_per_epoch_too(in_tmp):
    # validation at each epoch's end (the paper profile's; Lightning then saves checkpoints
    # at the epoch's end, not at the validation): 16 examples of batch 4, 3 epochs of 4 steps
    run(["fit", "--config", config("p4.yaml"), *SMOKE, "--model.lr", "1e-12",
         "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "-1",
         "--trainer.max_epochs", "3", "--trainer.val_check_interval", "1.0",
         "--trainer.check_val_every_n_epoch", "1",
         "--data.train_segments", "[{seq_len: 32, num_kv_pairs: 4, num_examples: 16}]",
         "--data.batch_size", "4"])
    ckpts = in_tmp / "runs/p4/checkpoints"
    assert [p.name for p in ckpts.glob("best-*.ckpt")] == ["best-step=4.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=False)["global_step"] == 12


def test_second_fit_of_a_name_replaces_last_ckpt(in_tmp, capsys):
    """A new fit of a name writes ``last.ckpt`` itself (no ``last-v1.ckpt``), so
    ``--ckpt_path runs/p4/checkpoints/last.ckpt`` is the latest run's; it says it replaces one."""
    fast = ["--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    run(["fit", "--config", config("p4.yaml"), *SMOKE, *fast, "--trainer.max_steps", "2"])
    assert "note: this fit replaces" not in capsys.readouterr().err
    run(["fit", "--config", config("p4.yaml"), *SMOKE, *fast, "--trainer.max_steps", "4",
         "--model.lr", "0.002"])
    ckpts = in_tmp / "runs/p4/checkpoints"
    assert sorted(p.name for p in ckpts.glob("last*.ckpt")) == ["last.ckpt"]
    last = torch.load(ckpts / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4
    assert last["hyper_parameters"]["lr"] == pytest.approx(0.002)
    err = capsys.readouterr().err
    assert "note: this fit replaces runs/p4/checkpoints/last.ckpt, an earlier run's" in err
