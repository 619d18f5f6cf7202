"""The diagnosis switches of issue 13 train at smoke size from the command line."""

import pytest
import torch
from paths import SMOKE, config

from arbench.cli import run


@pytest.mark.parametrize("switch", [
    ["--model.qk_norm", "true"],
    ["--model.feature_map.init_args.affine", "true"],
    ["--model.feature_map_weight_decay", "0"],
    ["--model.feature_map.init_args.square", "true", "--model.normalize", "abs"],
    ["--model.feature_map.init_args.temperature", "1.0"],
], ids=["qk_norm", "affine", "no_fm_decay", "square_denominator", "temperature"])
def test_switch_trains_at_smoke_size(in_tmp, switch):
    cli = run(["fit", "--config", config("p4.yaml"), *SMOKE, *switch,
               "--trainer.max_steps", "6", "--trainer.val_check_interval", "6",
               "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 6
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
