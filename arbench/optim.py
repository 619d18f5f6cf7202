"""AdamW for arbench: the fused kernel where torch has one for every parameter's device.

The fused update (one kernel over all tensors) replaces the per-tensor loop torch uses on a
CPU by default (``python -m arbench.bench``'s training table is measured with it; what it
gained: results/kernels.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

FUSED_DEVICES = ("cpu", "cuda")


def can_fuse(params: Iterable[torch.Tensor]) -> bool:
    """True when every parameter is a floating tensor on a device with a fused AdamW."""
    params = list(params)
    return bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point()
                                for p in params)


def make_adamw(params: Iterable[Any], *, allow_fused: bool = True, **kwargs: Any
               ) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, **kwargs)``, fused when ``allow_fused`` and :func:`can_fuse`.

    ``params``: tensors or parameter groups (dicts with ``"params"``), as AdamW takes them.
    """
    params = list(params)
    tensors = [t for g in params for t in (g["params"] if isinstance(g, dict) else [g])]
    # None, not False, when unfused: torch then picks its default (foreach on CUDA)
    return torch.optim.AdamW(params, fused=True if allow_fused and can_fuse(tensors) else None,
                             **kwargs)
