"""The CP product of LLoPS and PolySketch on a GPU: :func:`arbench.naive.naive_cp_product`
(the reference) through ``torch.compile``.

Eagerly, ``Σ_r Π_j (x W_{j,r} + b_{j,r})`` is one matmul and then p − 1 products and a rank
sum, each a kernel that reads and writes ``(rows, rank·m)`` tensors (their backward as many
again). Compiled, the bias, the products and the rank sum fuse into one kernel after the
matmul (and one in the backward), so the feature map costs about its matmul. One graph per
(p, rank, bias or not, dtype, grad mode); sequence lengths are dynamic, so a new n does not
recompile. Used where :func:`arbench.precision.use_cuda_kernels` holds (not inside a compiled
model: there the caller's graph already contains the reference form).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from arbench.naive import naive_cp_product


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    """The compiled reference (built on first use)."""
    # every graph of the product shares one code object: p ∈ {2, 4, 6} × fp32/bf16 × grad or
    # not × LLoPS/PolySketch weights in one benchmark exceeds dynamo's default of 8 graphs
    # (past it, calls silently run eagerly)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(naive_cp_product, dynamic=True)


def compiled_cp_product(x: torch.Tensor, w: torch.Tensor, p: int, rank: int,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`arbench.naive.naive_cp_product` compiled: ``x`` ``(..., d)``; ``w``, ``bias``:
    the factor-major layout of :func:`arbench.featuremaps.cp_weights`; returns ``(..., m)``."""
    return _compiled()(x, w, p, rank, bias)


__all__ = ["compiled_cp_product"]
