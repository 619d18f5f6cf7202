import functools

import lightning as L
import pytest
import torch

from arbench.data import Segment
from arbench.data.datamodule import MQARDataModule
from arbench.denormals import SMALLEST_NORMAL, Flush, flushing
from arbench.featuremaps import LLoPS
from arbench.lit import LitRecall

if not torch.set_flush_denormal(False):
    pytest.skip("this CPU cannot flush subnormals", allow_module_level=True)


def test_flushing_reads_the_cpu_setting_and_flush_restores_it():
    torch.set_flush_denormal(False)
    assert not flushing()
    assert (torch.tensor([SMALLEST_NORMAL]) / 4).item() > 0   # a subnormal is computed
    flush = Flush()
    flush.start()
    assert flushing()
    assert (torch.tensor([SMALLEST_NORMAL]) / 4).item() == 0.0
    assert (torch.tensor([SMALLEST_NORMAL]) * 4).item() == SMALLEST_NORMAL * 4   # normals exact
    flush.start()   # idempotent: still restores the setting from before the first start
    flush.stop()
    assert not flushing()
    torch.set_flush_denormal(True)
    flush.start()
    flush.stop()
    assert flushing()   # a setting that was on stays on
    torch.set_flush_denormal(False)


class Seen(L.Callback):
    def __init__(self) -> None:
        self.training: list[bool] = []
        self.validating: list[bool] = []

    def on_train_batch_start(self, *args) -> None:
        self.training.append(flushing())

    def on_validation_batch_start(self, *args) -> None:
        self.validating.append(flushing())


def test_a_fit_flushes_subnormals_while_it_runs_and_restores_the_setting():
    torch.set_flush_denormal(False)
    seen = Seen()
    data = MQARDataModule(vocab_size=64, train_segments=[Segment(32, 4, 64)],
                          test_segments=[Segment(32, 4, 16)], batch_size=16, eval_batch_size=8)
    model = LitRecall(vocab_size=64, d_model=16, feature_map=functools.partial(LLoPS, m=8, p=2))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, max_steps=2,
                        callbacks=[seen])
    trainer.fit(model, data)
    assert seen.training == [True, True] and seen.validating and all(seen.validating)
    assert not flushing()
    trainer.validate(model, data, verbose=False)
    assert not flushing()
