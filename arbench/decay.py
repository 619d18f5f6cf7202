"""Helpers shared by the gated linear attention and the delta rule: the ``log_decay`` check,
padding to whole chunks and the masked decay matrix.

A decay α_t = exp(log_decay_t) ∈ (0, 1] scales the state before token t is added. Within a
block of tokens the products of decays are ``exp(b_i − b_j)`` with ``b`` the running sum of
``log_decay``; for j ≤ i the exponent is ≤ 0, so every factor stays in (0, 1] and never
overflows, however long the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_log_decay(log_decay: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise a one-line ``ValueError`` unless ``log_decay`` has ``shape`` ``(batch, heads, seq)``
    and values ≤ 0 and > −∞. NaN passes through (to NaN outputs), so a model whose activations
    blew up is reported by the training loop's divergence guard. The value check is skipped
    while ``torch.compile`` traces."""
    if tuple(log_decay.shape) != tuple(shape):
        raise ValueError(f"log_decay must have shape (batch, heads, seq) = {tuple(shape)}, "
                         f"got {tuple(log_decay.shape)}")
    if torch.compiler.is_compiling():
        return
    if bool(((log_decay > 0) | torch.isinf(log_decay)).any()):
        raise ValueError("log_decay must be finite and <= 0 (a decay exp(log_decay) in (0, 1])")


def pad_rows(t: torch.Tensor, pad: int, scalar: bool = False) -> torch.Tensor:
    """Append ``pad`` zeros on the sequence axis of ``(..., n, d)``, or of ``(..., n)`` when
    ``scalar`` (one number per token: ``log_decay``, ``beta``)."""
    if pad == 0:
        return t
    return F.pad(t, (0, pad) if scalar else (0, 0, 0, pad))


def decay_matrix(b: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    """``D[..., i, j] = exp(b_i − b_j)`` for ``j ≤ i + diagonal``, 0 elsewhere (``diagonal`` 0
    keeps the diagonal, −1 only ``j < i``); ``(..., c, c)``.

    ``b``: ``(..., c)`` running sums of log-decays (non-increasing along the last axis).
    The entries above the kept triangle are set to −∞ *before* ``exp``, so a large positive
    ``b_i − b_j`` (j > i) is never exponentiated and its gradient is exactly zero.
    """
    c = b.shape[-1]
    keep = torch.ones(c, c, dtype=torch.bool, device=b.device).tril(diagonal)
    diff = b.unsqueeze(-1) - b.unsqueeze(-2)  # (..., c, c): b_i − b_j
    return diff.masked_fill(~keep, float("-inf")).exp()
