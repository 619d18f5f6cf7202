"""Causal linear attention in three equivalent forms, and the softmax reference.

With query features f_i, key features g_j and values v_j::

    y_i = Σ_{j≤i} (f_i·g_j) v_j / den_i,      den_i = Σ_{j≤i} f_i·g_j

The three forms share one trick: the denominator is the last output column of the same
computation run on ``[v, 1]``, so every form computes numerator and denominator together.

Denominator (``normalize``):

- ``True`` / ``"signed"``: den is pushed away from zero keeping its sign,
  ``den ← sign(den)·max(|den|, eps)`` (sign(0) = +1). Signed features (LLoPS with odd products,
  no squaring) can make den cross zero; this bounds ``|y| ≤ |num| / eps`` so no Inf/NaN appears.
- ``"abs"``: ``den ← max(|den|, eps)``: the magnitude only.
- ``False`` / ``"none"``: no denominator (pair it with an output norm in the mixer).

State and denominator are accumulated in float32 whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MODES = ("quadratic", "recurrent", "chunked")
NORMALIZE = ("signed", "abs", "none")


def normalize_option(normalize: bool | str) -> str:
    """Map ``True``/``False``/a name to one of ``NORMALIZE``; raise ``ValueError`` otherwise."""
    if normalize is True:
        return "signed"
    if normalize is False:
        return "none"
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be True, False or one of {NORMALIZE}, got {normalize!r}")
    return normalize


def safe_denominator(den: torch.Tensor, eps: float, how: str) -> torch.Tensor:
    """Keep ``den`` at least ``eps`` away from zero: ``"signed"`` keeps the sign, ``"abs"`` not."""
    if how == "abs":
        return den.abs().clamp_min(eps)
    return torch.where(den >= 0, den.clamp_min(eps), den.clamp_max(-eps))


def _quadratic(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    n = f.shape[-2]
    scores = f @ g.transpose(-1, -2)  # (b, h, n, n)
    causal = torch.ones(n, n, dtype=torch.bool, device=f.device).tril()
    return scores.masked_fill(~causal, 0.0) @ v


def _recurrent(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    state = f.new_zeros(*f.shape[:-2], f.shape[-1], v.shape[-1])  # (b, h, m, dv)
    outs = []
    for i in range(f.shape[-2]):
        state = state + g[..., i, :, None] * v[..., i, None, :]
        outs.append((f[..., i, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=-2)


class _RunningSum(torch.autograd.Function):
    """Inclusive running sum over the chunk axis (dim −3) of ``(..., nc, m, dv)``, in place.

    A loop of in-place adds over chunks (not tokens). On the 2-core CPU ``torch.cumsum`` over
    that axis ran several times slower alone (nc = 63, m = 256, dv = 128: 7.5 ms against
    1.0 ms; power-of-two strides); in whole layers at n = 4k–16k, chunk 256, this made them
    1.00–1.09× faster (interleaved A/B, medians of 7). The backward is the reverse sum.
    """

    @staticmethod
    def forward(ctx, states: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for i in range(1, states.shape[-3]):
            states[..., i, :, :].add_(states[..., i - 1, :, :])
        ctx.mark_dirty(states)
        return states

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.clone()
        for i in range(grad.shape[-3] - 2, -1, -1):
            grad[..., i, :, :].add_(grad[..., i + 1, :, :])
        return grad


def running_sum(states: torch.Tensor) -> torch.Tensor:
    """``states.cumsum(dim=-3)``; on a CPU in eager mode in place (:class:`_RunningSum`)."""
    if states.device.type != "cpu" or torch.compiler.is_compiling():
        return states.cumsum(dim=-3)
    return _RunningSum.apply(states)


def _chunked(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Exact causal products inside chunks of ``c`` rows plus the state carried between chunks.

    The intra-chunk scores are masked in place (``tril_``); the state before chunk i,
    ``S_i = Σ_{j<i} G_jᵀ V_j``, is the running sum of the per-chunk states of chunks ``0..nc-2``
    (the last chunk's state is never read), and ``F_i S_i`` is added in place to the rows of
    chunks ``1..nc-1``: no mask tensor, no zero state, no concatenation.
    """
    *lead, n, m = f.shape
    c = min(chunk_size, n)
    pad = (-n) % c
    if pad:  # zero features add nothing to the state; padded outputs are dropped
        f, g, v = (F.pad(t, (0, 0, 0, pad)) for t in (f, g, v))
    nc = (n + pad) // c
    fc, gc, vc = (t.unflatten(-2, (nc, c)) for t in (f, g, v))
    out = (fc @ gc.transpose(-1, -2)).tril_() @ vc  # intra-chunk, (..., nc, c, dv)
    if nc > 1:
        states = running_sum(gc[..., :-1, :, :].transpose(-1, -2) @ vc[..., :-1, :, :])
        out[..., 1:, :, :] += fc[..., 1:, :, :] @ states  # (..., nc-1, c, dv)
    return out.flatten(-3, -2)[..., :n, :]


_FORMS = {"quadratic": _quadratic, "recurrent": _recurrent, "chunked": _chunked}


def linear_attention(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, *, mode: str = "chunked",
                     chunk_size: int = 64, normalize: bool | str = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention.

    ``f, g``: ``(batch, heads, seq, m)``; ``v``: ``(batch, heads, seq, dv)``;
    returns ``(batch, heads, seq, dv)`` in ``v``'s dtype.
    """
    if mode not in _FORMS:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    how = normalize_option(normalize)
    if f.shape != g.shape or f.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shape mismatch: f {tuple(f.shape)}, g {tuple(g.shape)}, "
                         f"v {tuple(v.shape)}; expected f, g (b, h, n, m) and v (b, h, n, dv)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out_dtype = v.dtype
    f, g, v = f.float(), g.float(), v.float()
    if how != "none":
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    out = _FORMS[mode](f, g, v, chunk_size)
    if how != "none":
        out = out[..., :-1] / safe_denominator(out[..., -1:], eps, how)
    return out.to(out_dtype)


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention via ``scaled_dot_product_attention``; ``(b, h, n, d)`` in and out."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
