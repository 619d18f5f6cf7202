"""Causal linear attention in three equivalent forms, its gated variant, the delta rule
(:func:`delta_attention`, in :mod:`arbench.delta`) and the softmax reference.

With query features f_i, key features g_j and values v_j::

    y_i = Σ_{j≤i} (f_i·g_j) v_j / den_i,      den_i = Σ_{j≤i} f_i·g_j

Gated (``log_decay`` given, α_t = exp(log_decay_t) ∈ (0, 1]): the state decays before each
token is added, ``S_t = α_t S_{t−1} + g_t v_tᵀ``, ``y_t = S_tᵀ f_t``, i.e.
``y_i = Σ_{j≤i} exp(b_i − b_j) (f_i·g_j) v_j`` with ``b_i = Σ_{s≤i} log α_s``; the denominator's
state decays the same way.

The three forms share one trick: the denominator is the last output column of the same
computation run on ``[v, 1]``, so every form computes numerator and denominator together.

Denominator (``normalize``):

- ``True`` / ``"signed"``: den is pushed away from zero keeping its sign,
  ``den ← sign(den)·max(|den|, eps)`` (sign(0) = +1). Signed features (LLoPS with odd products,
  no squaring) can make den cross zero; this bounds ``|y| ≤ |num| / eps`` so no Inf/NaN appears.
- ``"abs"``: ``den ← max(|den|, eps)``: the magnitude only.
- ``False`` / ``"none"``: no denominator (pair it with an output norm in the mixer).

Precision (:mod:`arbench.precision`): the reference forms (quadratic, recurrent, and every form
off the CPU kernels) compute in fp32, or in float64 for float64 inputs, with autocast off. The
chunked CPU kernel takes bf16 operands under autocast (its intra-chunk products and per-chunk
states are bf16 matmuls) and keeps the running state, the output and the denominator in fp32.
The gated forms (``log_decay``) are reference forms in this sense: they run in plain tensor ops,
in fp32 (float64 for float64 inputs) with autocast off.

On a GPU the chunked form (gated or not) runs fla's ``chunk_simple_gla`` where
:func:`arbench.kernels.fla_backend.fla_dtype` says so (CUDA, fla installed, bf16/fp16 compute
dtype: autocast's or the inputs'); its operands and output are in that dtype, the denominator
is divided out in fp32 as here. ``chunk_size`` does not apply there (fla's chunk of 64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from arbench import kernels
from arbench.decay import check_log_decay, decay_matrix, pad_rows
from arbench.delta import delta_attention
from arbench.kernels import fla_backend
from arbench.precision import accumulator_dtype, kernel_dtype, use_cpu_kernels

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


def _quadratic(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int,
               log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """The ``(n, n)`` matrix of weights; with decays ``exp(b_i − b_j)`` from running sums over
    the whole sequence (a reference: very long, strongly decayed sequences lose digits in
    ``b_i − b_j``, which the chunked form keeps per chunk)."""
    n = f.shape[-2]
    scores = f @ g.transpose(-1, -2)  # (b, h, n, n)
    if log_decay is not None:
        return (scores * decay_matrix(log_decay.cumsum(dim=-1))) @ v
    causal = torch.ones(n, n, dtype=torch.bool, device=f.device).tril()
    return scores.masked_fill(~causal, 0.0) @ v


def _recurrent(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int,
               log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """The definition, token by token: ``S_t = α_t S_{t−1} + g_t v_tᵀ``, ``y_t = S_tᵀ f_t``."""
    state = f.new_zeros(*f.shape[:-2], f.shape[-1], v.shape[-1])  # (b, h, m, dv)
    outs = []
    for i in range(f.shape[-2]):
        if log_decay is not None:
            state = state * log_decay[..., i, None, None].exp()
        state = state + g[..., i, :, None] * v[..., i, None, :]
        outs.append((f[..., i, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=-2)


def chunked_plain(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, c: int) -> torch.Tensor:
    """The chunked form on padded inputs in autograd-traced tensor ops (GPUs,
    ``torch.compile``; the reference of :func:`arbench.kernels.chunked_attention`):
    ``O_i = tril(F_i G_iᵀ) V_i + F_i S_i``, ``S_i = Σ_{j<i} G_jᵀ V_j``.
    ``f, g``: ``(..., nc·c, m)``; ``v``: ``(..., nc·c, dv)``; returns ``(..., nc·c, dv)``."""
    nc = f.shape[-2] // c
    fc, gc, vc = (t.unflatten(-2, (nc, c)) for t in (f, g, v))
    out = (fc @ gc.transpose(-1, -2)).tril_() @ vc  # intra-chunk, (..., nc, c, dv)
    if nc > 1:
        states = (gc[..., :-1, :, :].transpose(-1, -2) @ vc[..., :-1, :, :]).cumsum(dim=-3)
        out[..., 1:, :, :] += fc[..., 1:, :, :] @ states  # (..., nc-1, c, dv)
    return out.flatten(-3, -2)


def _chunked_gated(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                   c: int) -> torch.Tensor:
    """Chunked gated linear attention in autograd-traced ops on padded inputs.

    ``f, g``: ``(..., nc·c, m)``; ``v``: ``(..., nc·c, dv)``; ``log_decay``: ``(..., nc·c)``.
    With ``b_i`` the running sum of log-decays from the start of row i's chunk::

        y_i = Σ_{j≤i in chunk} exp(b_i − b_j) (f_i·g_j) v_j + exp(b_i) f_iᵀ S_chunk
        S_next = exp(b_last) S_chunk + Σ_j exp(b_last − b_j) g_j v_jᵀ

    Every exponent is ≤ 0. Intra-chunk terms and per-chunk updates are batched over chunks;
    only the ``(m, dv)`` state recursion loops over chunks.
    """
    nc = f.shape[-2] // c
    fc, gc, vc = (t.unflatten(-2, (nc, c)) for t in (f, g, v))
    b = log_decay.unflatten(-1, (nc, c)).cumsum(dim=-1)  # (..., nc, c)
    out = ((fc @ gc.transpose(-1, -2)) * decay_matrix(b)) @ vc  # (..., nc, c, dv)
    if nc == 1:
        return out.flatten(-3, -2)
    last = b[..., -1:]  # (..., nc, 1)
    updates = (gc * (last - b).exp().unsqueeze(-1)).transpose(-1, -2) @ vc  # (..., nc, m, dv)
    # per-chunk views by unbind: indexing in the loop would zero-fill a full gradient per chunk
    updates, decays = updates.unbind(-3), last.exp().unsqueeze(-1).unbind(-3)
    state = torch.zeros_like(updates[0])
    states = [state]  # the state before each chunk
    for i in range(nc - 1):
        state = state * decays[i] + updates[i]
        states.append(state)
    out = out + (fc * b.exp().unsqueeze(-1)) @ torch.stack(states, dim=-3)
    return out.flatten(-3, -2)


def _chunked(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, chunk_size: int,
             log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """Exact causal products inside chunks of ``c`` rows plus the state carried between chunks.

    The intra-chunk scores are masked in place (``tril_``); the state before chunk i,
    ``S_i = Σ_{j<i} G_jᵀ V_j``, is the running sum of the per-chunk states of chunks ``0..nc-2``
    (the last chunk's state is never read), and ``F_i S_i`` is added in place to the rows of
    chunks ``1..nc-1``: no mask tensor, no zero state, no concatenation. On a CPU the kernel
    :func:`arbench.kernels.chunked_attention` (its own backward), elsewhere
    :func:`chunked_plain`. With ``log_decay``, :func:`_chunked_gated` (gradients by autograd).
    """
    *lead, n, m = f.shape
    c = min(chunk_size, n)
    pad = (-n) % c
    # zero features add nothing to the state (a padded decay of 0 keeps it); outputs dropped
    f, g, v = (pad_rows(t, pad) for t in (f, g, v))
    if log_decay is not None:
        out = _chunked_gated(f, g, v, pad_rows(log_decay, pad, scalar=True), c)
    elif not use_cpu_kernels(f):
        out = chunked_plain(f, g, v, c)
    else:
        out = kernels.chunked_attention(f, g, v, c)
    return out[..., :n, :]


_FORMS = {"quadratic": _quadratic, "recurrent": _recurrent, "chunked": _chunked}


def linear_attention(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, *, mode: str = "chunked",
                     chunk_size: int = 64, normalize: bool | str = True, eps: float = 1e-6,
                     log_decay: torch.Tensor | None = None) -> torch.Tensor:
    """Causal linear attention, gated when ``log_decay`` is given.

    ``f, g``: ``(batch, heads, seq, m)``; ``v``: ``(batch, heads, seq, dv)``; ``log_decay``:
    ``(batch, heads, seq)``, finite and ≤ 0 (α_t = exp(log_decay_t)); returns
    ``(batch, heads, seq, dv)`` in ``v``'s dtype.
    """
    if mode not in _FORMS:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    how = normalize_option(normalize)
    if f.shape != g.shape or f.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shape mismatch: f {tuple(f.shape)}, g {tuple(g.shape)}, "
                         f"v {tuple(v.shape)}; expected f, g (b, h, n, m) and v (b, h, n, dv)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if log_decay is not None:
        check_log_decay(log_decay, f.shape[:-1])
    out_dtype, acc = v.dtype, accumulator_dtype(f, g, v)
    # the CPU kernel takes bf16 operands under autocast, fla (CUDA) bf16/fp16 ones; every other
    # form computes in ``acc``
    form = "linear" if log_decay is None else "gated"
    fla = fla_backend.fla_dtype(form, f, g, v) if mode == "chunked" else None
    kernel = mode == "chunked" and log_decay is None and use_cpu_kernels(f)
    dtype = fla or (kernel_dtype(f, g, v) if kernel else acc)
    f, g, v = f.to(dtype), g.to(dtype), v.to(dtype)
    if log_decay is not None:
        log_decay = log_decay.to(acc)
    if how != "none":
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    with torch.autocast(f.device.type, enabled=False):
        if fla:
            out = fla_backend.fla_linear(f, g, v, log_decay).to(acc)
        else:
            out = _FORMS[mode](f, g, v, chunk_size, log_decay).to(acc)
    if how != "none":
        out = out[..., :-1] / safe_denominator(out[..., -1:], eps, how)
    return out.to(out_dtype)


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention, scale 1/√d, via ``scaled_dot_product_attention``;
    ``(b, h, n, d)`` in and out."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          scale=1.0 / math.sqrt(q.shape[-1]))


__all__ = ["MODES", "NORMALIZE", "chunked_plain", "delta_attention", "linear_attention",
           "normalize_option",
           "safe_denominator", "softmax_attention"]
