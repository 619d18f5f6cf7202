"""A run killed mid-epoch and resumed trains on the batches the uninterrupted run would have:
the interrupted epoch goes on where it stopped (``ShardSampler``'s ``done``); and with dropout
it draws the masks the uninterrupted run would (the checkpoint keeps the random states)."""

import hashlib

import lightning as L
import pytest
from paths import SMOKE, config

from arbench.cli import run

SEEN: list[tuple[int, str]] = []
LOSSES: dict[int, float] = {}


class RecordBatches(L.Callback):
    """Appends (global step, a hash of the batch's inputs) to :data:`SEEN` before each step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        SEEN.append((trainer.global_step, hashlib.sha1(batch[0].numpy().tobytes()).hexdigest()))


class RecordLosses(L.Callback):
    """Keeps each step's training loss in :data:`LOSSES`."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        LOSSES[trainer.global_step - 1] = float(outputs["loss"])


class KillAt12(L.Callback):
    """Stops the run with an error before step 12 (its last checkpoint is step 10's)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 12:
            raise RuntimeError("killed")


class KillAt22(L.Callback):
    """Stops the run with an error before step 22, in its second epoch (last checkpoint:
    step 20's, 4 batches into that epoch)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 22:
            raise RuntimeError("killed")


def fit(*extra):
    # 64 training examples of the smoke profile, batch 4: one epoch is 16 steps, so step 12 is
    # mid-epoch and the run goes on into the next epoch
    run(["fit", "--config", config("p2.yaml"), *SMOKE, "--trainer.max_steps", "20",
         "--trainer.val_check_interval", "5", "--trainer.enable_progress_bar", "false",
         "--data.train_segments", "[{seq_len: 32, num_kv_pairs: 4, num_examples: 64}]",
         "--data.batch_size", "4", "--trainer.callbacks+=test_resume_order.RecordBatches",
         *extra])


def test_a_run_resumed_mid_epoch_sees_the_batches_an_uninterrupted_one_does(in_tmp):
    SEEN.clear()
    fit("--trainer.logger.init_args.name", "whole")
    whole = dict(SEEN)
    assert len(whole) == 20 and len(set(whole.values())) == 16  # epoch 2 repeats epoch 1's
    SEEN.clear()
    with pytest.raises(RuntimeError, match="killed"):
        fit("--trainer.logger.init_args.name", "cut",
            "--trainer.callbacks+=test_resume_order.KillAt12")
    SEEN.clear()
    fit("--trainer.logger.init_args.name", "cut", "--ckpt_path", "last")
    resumed = dict(SEEN)
    assert sorted(resumed) == list(range(10, 20))
    assert all(resumed[step] == whole[step] for step in resumed)


def test_a_run_resumed_in_a_later_epoch_goes_on_in_that_epochs_order(in_tmp):
    """The second epoch is shuffled in its own order: a run killed there resumes in it, not
    in the first epoch's (which Lightning's sampler epoch, set after the resumed loader
    started, would give)."""
    longer = ("--trainer.max_steps", "26")
    SEEN.clear()
    fit("--trainer.logger.init_args.name", "whole", *longer)
    whole = dict(SEEN)
    assert [whole[s] for s in range(16, 26)] != [whole[s] for s in range(0, 10)]
    with pytest.raises(RuntimeError, match="killed"):
        fit("--trainer.logger.init_args.name", "cut", *longer,
            "--trainer.callbacks+=test_resume_order.KillAt22")
    SEEN.clear()
    fit("--trainer.logger.init_args.name", "cut", "--ckpt_path", "last", *longer)
    resumed = dict(SEEN)
    assert sorted(resumed) == list(range(20, 26))
    assert all(resumed[step] == whole[step] for step in resumed)


def test_a_run_resumed_with_dropout_draws_the_masks_an_uninterrupted_one_does(in_tmp):
    """Embedding dropout (zoology's recipe) draws from torch's global generator: restored from
    the checkpoint, the resumed steps' losses are the uninterrupted run's, bit for bit."""
    dropout = ("--model.embedding_dropout", "0.3",
               "--trainer.callbacks+=test_resume_order.RecordLosses")
    LOSSES.clear()
    fit("--trainer.logger.init_args.name", "whole", *dropout)
    whole = dict(LOSSES)
    with pytest.raises(RuntimeError, match="killed"):
        fit("--trainer.logger.init_args.name", "cut",
            "--trainer.callbacks+=test_resume_order.KillAt12", *dropout)
    LOSSES.clear()
    fit("--trainer.logger.init_args.name", "cut", "--ckpt_path", "last", *dropout)
    assert sorted(LOSSES) == list(range(10, 20))
    assert all(LOSSES[step] == whole[step] for step in LOSSES)
