"""Reference forms: the definition of each CPU kernel in plain tensor ops, named ``naive_*`` so
that a name says which form it is (as fla's ``naive.py`` files do). Autograd gives their
gradients; ``tests/kernels/`` compares every kernel of :mod:`arbench.kernels` with its form here
(value and gradient), and the models run these where the kernels do not (GPUs without a CUDA
path, compiled graphs, ``arbench.precision.cpu_kernels(False)``).

| reference | kernel |
|---|---|
| :func:`naive_cp_product` | :func:`arbench.kernels.cp_product` (and, on a GPU, this form compiled) |
| :func:`naive_projected_power` | :func:`arbench.kernels.projected_power` |
| :func:`naive_taylor_features` | :func:`arbench.kernels.taylor_features` |
| :func:`naive_causal_conv` | :func:`arbench.kernels.causal_conv` |
"""

from __future__ import annotations

import torch
from torch import nn


def naive_cp_product(x: torch.Tensor, w: torch.Tensor, p: int, rank: int,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_r Π_j (x W_{j,r} + b_{j,r}). ``x``: ``(..., d)``; ``w`` ``(d, p·rank·m)`` and ``bias``
    ``(p·rank·m,)`` in the factor-major layout of :func:`arbench.featuremaps.cp_weights`;
    returns ``(..., m)``."""
    proj = x @ w if bias is None else x @ w + bias
    factors = proj.unflatten(-1, (p, w.shape[1] // p))
    out = factors[..., 0, :]
    for j in range(1, p):
        out = out * factors[..., j, :]
    return out.unflatten(-1, (rank, -1)).sum(dim=-2)


def int_power(y: torch.Tensor, p: int) -> torch.Tensor:
    """``y ** p`` for an integer ``p >= 1`` by left-to-right binary powering (p = 4: two
    squarings; p = 6: y², y³, y⁶)."""
    out = y
    for bit in bin(p)[3:]:  # the bits after the leading one
        out = out * out
        if bit == "1":
            out = out * y
    return out


def naive_projected_power(x: torch.Tensor, w: torch.Tensor, p: int) -> torch.Tensor:
    """``(x @ w) ** p`` elementwise. ``x``: ``(..., d)``, ``w``: ``(d, m)``; returns
    ``(..., m)``."""
    return int_power(x @ w, p)


def naive_taylor_features(xt: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """``[1, a·x̃, b·vec(x̃ x̃ᵀ)]``: ``(..., r)`` → ``(..., 1 + r + r²)`` (BASED's map of the
    projection x̃)."""
    second = ((xt * b).unsqueeze(-1) * xt.unsqueeze(-2)).flatten(-2)
    return torch.cat([torch.ones_like(xt[..., :1]), xt * a, second], dim=-1)


def naive_causal_conv(h: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """``conv`` (depthwise, padded k − 1 on both sides) over the transposed sequence, its first
    n outputs: the causal convolution of ``h`` ``(batch, n, d)``."""
    return conv(h.transpose(1, 2))[..., : h.shape[1]].transpose(1, 2)


__all__ = ["int_power", "naive_causal_conv", "naive_cp_product", "naive_projected_power",
           "naive_taylor_features"]
