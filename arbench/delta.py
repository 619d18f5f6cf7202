"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet) for any feature map.

With query features f_t, key features g_t ∈ R^m, values v_t ∈ R^dv, a write strength
β_t ∈ [0, 1] and a decay α_t = exp(log_decay_t) ∈ (0, 1] (1 without ``log_decay``)::

    S_t = α_t (I − β_t g_t g_tᵀ) S_{t−1} + β_t g_t v_tᵀ,   S_0 = 0,   y_t = S_tᵀ f_t

(S ∈ R^{m×dv}). Equivalently ``S_t = α_t S_{t−1} + β_t g_t (v_t − α_t S_{t−1}ᵀ g_t)ᵀ``: the
state's current answer for key g_t is moved towards v_t. It is stable (a contraction) when
``β_t |g_t|² ≤ 2``; the mixers L2-normalise g (and f) after the feature map
(:func:`l2_normalize`), so the rule sees the map's cosine kernel
``K(f, g) / √(K(f, f) K(g, g))``.

Two forms: ``recurrent``, the definition token by token, and ``chunked``, exact, by the WY / UT
representation (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length"; the decay folded in as in Gated DeltaNet, Yang et al. 2025). Within a chunk
of rows i = 1..c with state S at its start, ``b_i`` the running sum of log-decays from the chunk
start and ``γ_i = exp(b_i)``, the state after row i is

    S_i = γ_i S + Σ_{j≤i} exp(b_i − b_j) g_j u_jᵀ,

where the pseudo-values u solve the unit lower-triangular system

    (I + tril(diag(β) (Γ ⊙ G Gᵀ), −1)) U = diag(β) (V − diag(γ) G S),   Γ_ij = exp(b_i − b_j).

With ``T = (I + tril(diag(β)(Γ ⊙ GGᵀ), −1))⁻¹ diag(β)``, ``W = T diag(γ) G`` and ``Ũ = T V``
(both independent of S, batched over all chunks): ``U = Ũ − W S``, the chunk's outputs are
``diag(γ) F S + (tril(F Gᵀ) ⊙ Γ) U`` and the next state ``γ_c S + (diag(γ_c / γ) G)ᵀ U``. All
decay factors are exponentials of non-positive numbers. Only this ``(m, dv)`` recursion loops
over chunks; gradients come from autograd.

On a GPU the chunked form runs fla's ``chunk_delta_rule`` / ``chunk_gated_delta_rule`` where
:func:`arbench.kernels.fla_backend.fla_dtype` says so (CUDA, fla installed, bf16/fp16 compute
dtype, at most 256 features), in that dtype, with fla's chunk of 64.
"""

from __future__ import annotations

import torch

from arbench.decay import check_log_decay, decay_matrix, pad_rows
from arbench.kernels import fla_backend
from arbench.precision import accumulator_dtype

DELTA_MODES = ("recurrent", "chunked")
L2_EPS = 1e-6
"""The ε of :func:`l2_normalize` (fla's ``l2norm``)."""


def l2_normalize(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """``x / √(|x|² + eps)`` over the last dim, computed in at least fp32 and returned in
    ``x``'s dtype (fla's ``l2norm``): a unit vector for ``|x|² ≫ eps``, and near zero for a
    near-zero ``x``, whose delta-rule write then vanishes (``x / max(|x|, ε)`` would blow such
    a vector, e.g. a ReLU map's all-floor features, up to a full-strength write)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def _delta_recurrent(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                     log_decay: torch.Tensor | None) -> torch.Tensor:
    """The definition, one token at a time. ``f, g``: ``(..., n, m)``; ``v``: ``(..., n, dv)``;
    ``beta``, ``log_decay``: ``(..., n)``; returns ``(..., n, dv)``."""
    state = f.new_zeros(*f.shape[:-2], f.shape[-1], v.shape[-1])  # (..., m, dv)
    outs = []
    for t in range(f.shape[-2]):
        if log_decay is not None:
            state = state * log_decay[..., t, None, None].exp()
        k = g[..., t, :]
        error = v[..., t, :] - (k.unsqueeze(-2) @ state).squeeze(-2)  # v_t − Sᵀ g_t, (..., dv)
        state = state + beta[..., t, None, None] * k.unsqueeze(-1) * error.unsqueeze(-2)
        outs.append((f[..., t, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=-2)


def _delta_chunked(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                   log_decay: torch.Tensor | None, c: int) -> torch.Tensor:
    """The UT-transform form (module docstring) on padded inputs of ``nc·c`` rows.

    ``f, g``: ``(B, nc·c, m)``; ``v``: ``(B, nc·c, dv)``; ``beta``, ``log_decay``:
    ``(B, nc·c)``; returns ``(B, nc·c, dv)``. Everything that does not depend on the state is
    batched over the chunks; the loop only carries ``S`` (two fused multiply-adds a chunk),
    and the outputs are two batched products after it.
    """
    (batch, n, m), dv = f.shape, v.shape[-1]
    nc = n // c
    fc, gc, vc = (t.unflatten(-2, (nc, c)) for t in (f, g, v))  # (B, nc, c, ·)
    bc = beta.unflatten(-1, (nc, c)).unsqueeze(-1)  # (B, nc, c, 1)
    gram = gc @ gc.transpose(-1, -2)  # (B, nc, c, c)
    scores = fc @ gc.transpose(-1, -2)
    if log_decay is None:
        gram, scores = gram.tril(-1), scores.tril()
        g_start, g_end, f_start, chunk_decay = gc, gc, fc, None
    else:
        b = log_decay.unflatten(-1, (nc, c)).cumsum(dim=-1)  # (B, nc, c)
        gram, scores = gram * decay_matrix(b, -1), scores * decay_matrix(b)
        start = b.exp().unsqueeze(-1)  # γ_i: decay from the chunk start to row i
        g_start, f_start = gc * start, fc * start
        g_end = gc * (b[..., -1:] - b).exp().unsqueeze(-1)  # γ_c / γ_j
        chunk_decay = b[..., -1, None, None].exp()  # (B, nc, 1, 1)
    # T = (I + tril(diag(β)(Γ ⊙ GGᵀ), −1))⁻¹ diag(β): a unit lower-triangular solve against
    # the identity (the unit diagonal is implied), then its columns scaled by β. Solving
    # against the c×c identity and multiplying is faster than solving against [V, G].
    eye = torch.eye(c, dtype=f.dtype, device=f.device).expand_as(gram)
    t = torch.linalg.solve_triangular(bc * gram, eye, upper=False, unitriangular=True)
    t = t * bc.transpose(-1, -2)  # (B, nc, c, c)
    u_fixed, w = t @ vc, t @ g_start  # Ũ (B, nc, c, dv), W (B, nc, c, m)
    # per-chunk views by unbind (one stacked gradient each; indexing in the loop would
    # zero-fill a whole-sequence gradient per chunk)
    u_fixed, w, g_end_t = u_fixed.unbind(1), w.unbind(1), g_end.transpose(-1, -2).unbind(1)
    decays = [None] * nc if chunk_decay is None else chunk_decay.unbind(1)
    state = f.new_zeros(batch, m, dv)
    states, us = [], []
    for i in range(nc):
        states.append(state)  # the state before chunk i
        u = torch.baddbmm(u_fixed[i], w[i], state, alpha=-1)  # Ũ − W S, (B, c, dv)
        us.append(u)
        if decays[i] is not None:
            state = state * decays[i]
        state = torch.baddbmm(state, g_end_t[i], u)
    out = f_start @ torch.stack(states, dim=1) + scores @ torch.stack(us, dim=1)
    return out.flatten(1, 2)


def _check(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
           log_decay: torch.Tensor | None, mode: str, chunk_size: int) -> None:
    if mode not in DELTA_MODES:
        raise ValueError(f"delta rule mode must be one of {DELTA_MODES}, got {mode!r}")
    if f.dim() != 4 or f.shape != g.shape or f.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"shape mismatch: f {tuple(f.shape)}, g {tuple(g.shape)}, "
                         f"v {tuple(v.shape)}; expected f, g (b, h, n, m) and v (b, h, n, dv)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if tuple(beta.shape) != tuple(f.shape[:-1]):
        raise ValueError(f"beta must have shape (batch, heads, seq) = {tuple(f.shape[:-1])}, "
                         f"got {tuple(beta.shape)}")
    if not torch.compiler.is_compiling() and bool(((beta < 0) | (beta > 1)).any()):
        raise ValueError("beta must be in [0, 1]")  # NaN passes, as in check_log_decay
    if log_decay is not None:
        check_log_decay(log_decay, f.shape[:-1])


def delta_attention(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
                    log_decay: torch.Tensor | None = None, mode: str = "chunked",
                    chunk_size: int = 64) -> torch.Tensor:
    """Causal delta-rule attention, gated when ``log_decay`` is given (module docstring).

    ``f, g``: ``(batch, heads, seq, m)``; ``v``: ``(batch, heads, seq, dv)``; ``beta``:
    ``(batch, heads, seq)`` in [0, 1]; ``log_decay``: ``(batch, heads, seq)``, finite, ≤ 0.
    Returns ``(batch, heads, seq, dv)`` in ``v``'s dtype; computes in float32 (float64 when
    an input is float64) with autocast off, like the reference forms of ``linear_attention``.
    Any ``seq``: the chunked form pads to whole chunks with β = 0, g = 0 rows (they leave the
    state unchanged) and drops their outputs.
    """
    _check(f, g, v, beta, log_decay, mode, chunk_size)
    out_dtype, acc = v.dtype, accumulator_dtype(f, g, v)
    form = "delta" if log_decay is None else "gated_delta"
    fla = fla_backend.fla_dtype(form, f, g, v) if mode == "chunked" else None
    if fla:  # fla's kernels (CUDA, bf16/fp16), the decay in fp32
        f, g, v, beta = f.to(fla), g.to(fla), v.to(fla), beta.to(fla)
        with torch.autocast(f.device.type, enabled=False):
            out = fla_backend.fla_delta(f, g, v, beta,
                                        None if log_decay is None else log_decay.to(acc))
        return out.to(out_dtype)
    f, g, v, beta = f.to(acc), g.to(acc), v.to(acc), beta.to(acc)
    if log_decay is not None:
        log_decay = log_decay.to(acc)
    with torch.autocast(f.device.type, enabled=False):  # fp32 matmuls under autocast too
        if mode == "recurrent":
            return _delta_recurrent(f, g, v, beta, log_decay).to(out_dtype)
        (*lead, n, _), dv = f.shape, v.shape[-1]
        c = min(chunk_size, n)
        pad = (-n) % c
        f, g, v = (pad_rows(t, pad).flatten(0, -3) for t in (f, g, v))  # (B, n + pad, ·)
        beta = pad_rows(beta, pad, scalar=True).flatten(0, -2)
        if log_decay is not None:
            log_decay = pad_rows(log_decay, pad, scalar=True).flatten(0, -2)
        out = _delta_chunked(f, g, v, beta, log_decay, c).view(*lead, n + pad, dv)
    return out[..., :n, :].to(out_dtype)
