"""The opt-in subnormal flush: on while a trainer runs, the setting restored after, and
neutral (bit for bit) for every shipped method config when no subnormal arises."""

import pytest
import torch
from paths import ROOT, SMOKE, config

from arbench.cli import run
from arbench.denormals import SMALLEST_NORMAL, FlushSubnormals, flushing

if not torch.set_flush_denormal(False):
    pytest.skip("this CPU cannot flush subnormals", allow_module_level=True)

METHODS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
CALLBACK = "arbench.denormals.FlushSubnormals"


def fit(tmp_path, name: str, *extra: str):
    return run(["fit", "--config", config(name), *SMOKE, "--trainer.max_steps", "3",
                "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
                "--trainer.num_sanity_val_steps", "0", "--trainer.logger.init_args.save_dir",
                str(tmp_path), *extra])


def test_flushing_reads_the_cpu_setting():
    torch.set_flush_denormal(False)
    assert not flushing() and (torch.tensor([SMALLEST_NORMAL]) / 4).item() > 0
    torch.set_flush_denormal(True)
    assert flushing() and (torch.tensor([SMALLEST_NORMAL]) / 4).item() == 0.0
    assert (torch.tensor([SMALLEST_NORMAL]) * 4).item() == SMALLEST_NORMAL * 4  # normals exact
    torch.set_flush_denormal(False)


class SeenFlushing(FlushSubnormals):
    """The callback, recording the CPU's setting at each training step."""

    seen: list[bool] = []

    def on_train_batch_start(self, *args) -> None:
        SeenFlushing.seen.append(flushing())


def test_a_fit_with_the_callback_flushes_while_it_runs_and_restores_the_setting(tmp_path):
    torch.set_flush_denormal(False)
    SeenFlushing.seen.clear()
    cli = fit(tmp_path, "p2.yaml", "--trainer.callbacks+=test_denormals.SeenFlushing")
    assert cli.trainer.global_step == 3 and SeenFlushing.seen == [True] * 3
    assert not flushing()
    torch.set_flush_denormal(True)  # a setting that was on before stays on after
    fit(tmp_path / "on_before", "p2.yaml", f"--trainer.callbacks+={CALLBACK}")
    assert flushing()
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_trains_bit_for_bit_the_same_with_the_flush(tmp_path, name):
    torch.set_flush_denormal(False)
    plain = fit(tmp_path / "plain", name).model.state_dict()
    flushed = fit(tmp_path / "flushed", name, f"--trainer.callbacks+={CALLBACK}")
    assert any(isinstance(c, FlushSubnormals) for c in flushed.trainer.callbacks)
    assert not flushing()
    after = flushed.model.state_dict()
    assert plain.keys() == after.keys()
    assert all(torch.equal(plain[k], after[k]) for k in plain), name
