"""Subnormal fp32 values on the CPU, flushed to zero while a model trains: an opt-in callback.

x86 CPUs compute with subnormal (denormal) numbers, 0 < |x| < 1.18e-38 in fp32, on a slow path
that costs many times a normal operation. High-degree feature maps can make them: a product of
p factors of |xθ| < 1, or its square (``square=True``), falls below 1.18e-38 once a few factors
are small, and a run that drifts into that regime slows step by step (``results/README.md``,
"Subnormal floats": the φ² runs at p = 6 of ``diagnosis``). Flushing (FTZ/DAZ,
:func:`torch.set_flush_denormal`) computes those values as 0.

It is off by default and opt-in (``--trainer.callbacks+=arbench.denormals.FlushSubnormals``),
because it is not neutral for a run that lives among subnormals: such a run's losses differ
from the first step that meets one (results/README.md records a run whose flushed resume
diverged where the unflushed one did not). A run that never meets one computes bit for bit
as without it (``tests/test_denormals.py`` checks every shipped method config). It is a
process-wide CPU setting, so the callback restores the earlier one when the trainer is done.
CUDA is unaffected.
"""

from __future__ import annotations

import lightning as L
import torch

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
"""1.18e-38: fp32 values of smaller magnitude (but not 0) are subnormal."""


def flushing() -> bool:
    """Whether the CPU currently flushes subnormal fp32 values to zero."""
    subnormal = torch.tensor([SMALLEST_NORMAL / 4], dtype=torch.float32)
    return bool((subnormal * 1.0).item() == 0.0)


class FlushSubnormals(L.Callback):
    """Flush subnormal fp32 values to zero on the CPU from the trainer's set-up to its
    tear-down, then restore the setting from before (a CPU without the feature keeps
    computing subnormals, and the callback says so once)."""

    def __init__(self) -> None:
        self._before: bool | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._before is None:
            self._before = flushing()
            if not torch.set_flush_denormal(True):
                print("note: FlushSubnormals: this CPU cannot flush subnormals; they are "
                      "computed as usual", flush=True)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._before is not None:
            torch.set_flush_denormal(self._before)
            self._before = None


__all__ = ["SMALLEST_NORMAL", "FlushSubnormals", "flushing"]
