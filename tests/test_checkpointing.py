"""``last.ckpt`` follows every validation, also when the monitored val/acc did not improve."""

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
