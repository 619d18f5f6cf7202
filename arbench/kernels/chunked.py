"""Chunked causal linear attention with a hand-written backward.

Reference: :func:`arbench.attention.chunked_plain` (the chunked form in autograd-traced tensor
ops), and through it the quadratic and recurrent forms of :mod:`arbench.attention`; value and
gradient.
"""

from __future__ import annotations

import torch

from arbench.precision import CPU_AUTOCAST_DTYPE, accumulator_dtype


def running_sum_(states: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """In place: inclusive running sum over the chunk axis (dim −3) of ``(..., nc, m, dv)``,
    from the last chunk back when ``reverse``; returns ``states``. A loop of in-place adds
    over chunks (not tokens); reference: ``torch.cumsum`` over that axis (which ran slower
    over the strided axis on a CPU: results/kernels.md)."""
    nc = states.shape[-3]
    order = range(nc - 2, -1, -1) if reverse else range(1, nc)
    step = 1 if reverse else -1
    for i in order:
        states[..., i, :, :].add_(states[..., i + step, :, :])
    return states


def _add_bmm_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b`` for ``(B, k, rows, cols)`` slices: fused (``baddbmm`` into ``out``)
    when B = 1 and the dtypes agree, where the slice is one contiguous batch of matrices, else a
    matmul and an add. ``b`` is cast to ``a``'s dtype (an fp32 state against bf16 features);
    ``out`` may be wider than both (an fp32 output of bf16 products).
    (The ``out=`` form rather than ``baddbmm_``: the same kernel, and FLOP counters see it.)"""
    b = b.to(a.dtype)
    if out.shape[0] == 1 and out.dtype == a.dtype:
        torch.baddbmm(out[0], a[0], b[0], out=out[0])
    else:
        out.add_(a @ b)


class ChunkedAttention(torch.autograd.Function):
    """Chunked causal linear attention on padded ``(B, nc·c, ·)`` inputs with a hand-written
    backward: every gradient is accumulated into its own buffer (``baddbmm``, slices in
    place), so none of autograd's zero-filled slice gradients and sums over the whole sequence.

    Forward: ``O_i = tril(F_i G_iᵀ) V_i + F_i S_i`` with ``S_i = Σ_{j<i} G_jᵀ V_j``.
    Backward, with ``A_i = tril(F_i G_iᵀ)`` and ``D_i = ∂O_i``::

        ∂A_i = tril(D_i V_iᵀ),  ∂F_i = ∂A_i G_i + D_i S_iᵀ,  ∂G_i = ∂A_iᵀ F_i + V_i T_iᵀ,
        ∂V_i = A_iᵀ D_i + G_i T_i,   T_i = Σ_{j>i} F_jᵀ D_j  (a reverse running sum).

    Saves f, g, v, the masked scores ``A`` (``(B, nc, c, c)``, linear in n) and the states.

    Dtypes: the matmuls run in the inputs' dtype (bf16 under autocast: ``custom_fwd`` casts);
    the states ``S_i``, ``T_i`` are summed and the output is kept in :func:`accumulator_dtype`
    (fp32 for bf16 inputs), so the sums over chunks never round to bf16; each state is then
    rounded once to the inputs' dtype for the matmuls that read it (the forward's copy is the
    one saved for the backward). Gradients return in the inputs' dtype.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, f: torch.Tensor, g: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                c: int) -> torch.Tensor:
        (b, n, m), dv = f.shape, v.shape[-1]
        nc = n // c
        acc = accumulator_dtype(f)
        fc, gc, vc = f.view(b, nc, c, m), g.view(b, nc, c, m), v.view(b, nc, c, dv)
        scores = (fc @ gc.transpose(-1, -2)).tril_()  # (b, nc, c, c)
        out = (scores @ vc).to(acc)  # (b, nc, c, dv); no copy when the inputs are fp32
        states = None
        if nc > 1:  # states: (b, nc-1, m, dv), summed in acc, cast once to the matmuls' dtype
            states = running_sum_((gc[:, :-1].transpose(-1, -2) @ vc[:, :-1]).to(acc))
            states = states.to(f.dtype)
            _add_bmm_(out[:, 1:], fc[:, 1:], states)
        ctx.save_for_backward(f, g, v, scores, states)
        ctx.c, ctx.acc = c, acc
        return out.view(b, n, dv)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        f, g, v, scores, states = ctx.saved_tensors
        c = ctx.c
        (b, n, m), dv = f.shape, v.shape[-1]
        nc = n // c
        fc, gc, vc = f.view(b, nc, c, m), g.view(b, nc, c, m), v.view(b, nc, c, dv)
        d = grad_out.to(f.dtype).contiguous().view(b, nc, c, dv)
        d_scores = (d @ vc.transpose(-1, -2)).tril_()  # (b, nc, c, c)
        grad_f = d_scores @ gc
        grad_g = d_scores.transpose(-1, -2) @ fc
        grad_v = scores.transpose(-1, -2) @ d
        if nc > 1:
            _add_bmm_(grad_f[:, 1:], d[:, 1:], states.transpose(-1, -2))
            later = running_sum_((fc[:, 1:].transpose(-1, -2) @ d[:, 1:]).to(ctx.acc),
                                 reverse=True).to(f.dtype)  # summed in acc, cast once
            _add_bmm_(grad_g[:, :-1], vc[:, :-1], later.transpose(-1, -2))
            _add_bmm_(grad_v[:, :-1], gc[:, :-1], later)
        return grad_f.view(b, n, m), grad_g.view(b, n, m), grad_v.view(b, n, dv), None


def chunked_attention(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, c: int) -> torch.Tensor:
    """Unnormalised causal linear attention through :class:`ChunkedAttention`. ``f, g``:
    ``(..., nc·c, m)``; ``v``: ``(..., nc·c, dv)`` (the length a multiple of ``c``); returns
    ``(..., nc·c, dv)`` in :func:`accumulator_dtype`."""
    flat = [t.reshape(-1, *t.shape[-2:]).contiguous() for t in (f, g, v)]
    return ChunkedAttention.apply(*flat, c).view(*f.shape[:-1], v.shape[-1])


__all__ = ["ChunkedAttention", "chunked_attention", "running_sum_"]
