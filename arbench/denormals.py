"""Subnormal fp32 values on the CPU, flushed to zero while a model trains or evaluates.

x86 CPUs compute with subnormal (denormal) numbers, 0 < |x| < 1.18e-38 in fp32, through a slow
path that costs many times a normal operation. High-degree feature maps make them: a product
of p factors of |xθ| < 1, or its square (``square=True``), falls below 1.18e-38 once a few
factors are small, and a run that drifts into that regime slows down step by step
(``results/README.md``, the φ² runs at p = 6 of ``diagnosis``). Flushing (FTZ/DAZ,
:func:`torch.set_flush_denormal`) treats those values as 0; every other value is computed
exactly as before. It is a process-wide CPU setting, so :class:`Flush` restores the previous
one when the model's trainer is done with it. CUDA is unaffected.
"""

from __future__ import annotations

import torch

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
"""1.18e-38: fp32 values of smaller magnitude (but not 0) are subnormal."""


def flushing() -> bool:
    """Whether the CPU currently flushes subnormal fp32 values to zero."""
    subnormal = torch.tensor([SMALLEST_NORMAL / 4], dtype=torch.float32)
    return bool((subnormal * 1.0).item() == 0.0)


class Flush:
    """Turns flushing on with :meth:`start` and restores the earlier setting with :meth:`stop`
    (both idempotent; a CPU without the feature keeps computing subnormals)."""

    def __init__(self) -> None:
        self._before: bool | None = None

    def start(self) -> None:
        if self._before is None:
            self._before = flushing()
            torch.set_flush_denormal(True)

    def stop(self) -> None:
        if self._before is not None:
            torch.set_flush_denormal(self._before)
            self._before = None


__all__ = ["SMALLEST_NORMAL", "Flush", "flushing"]
