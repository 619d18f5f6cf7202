"""A plain-torch model of fla's documented recurrences and entry-point signatures
(``chunk_simple_gla``, ``chunk_delta_rule``, ``chunk_gated_delta_rule`` of fla-core 0.6), to
check arbench's mapping onto fla on a CPU. Written from fla's docstrings, not its code:

    layout (B, T, H, K) for q, k; (B, T, H, V) for v; (B, T, H) for g and beta
    S_0 = initial_state or 0                              (B, H, K, V)
    S ← exp(g_t) S                                         (gated forms; g: log decay)
    S ← S + k_t v_tᵀ                                       (simple_gla)
    S ← S + β_t k_t (v_t − Sᵀ k_t)ᵀ                        (delta rules)
    o_t = scale · Sᵀ q_t,  scale = K^-1/2 unless given
    use_qk_l2norm_in_kernel: q, k L2-normalised first

It also asserts what fla refuses (float32 in ``chunk_delta_rule``, K > 256 in the delta
rules, odd K or V in 16-bit dtypes), so a mapping that would trip fla trips here. The CUDA
tests check fla's kernels against this model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from arbench.kernels.fla_backend import FlaOps


def _fla_constraints(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: bool) -> None:
    assert q.shape == k.shape and q.dim() == 4 and v.shape[:3] == q.shape[:3], "layout (B,T,H,·)"
    if q.dtype in (torch.float16, torch.bfloat16):
        assert q.shape[-1] % 2 == 0 and v.shape[-1] % 2 == 0, "16-bit fla needs even K and V"
    if delta:
        assert q.dtype == k.dtype == v.dtype
        assert q.dtype != torch.float32, "chunk_delta_rule does not support float32"
        assert q.shape[-1] <= 256, "fla's delta kernels: K <= 256"


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
               beta: torch.Tensor | None, scale: float | None, initial_state: torch.Tensor | None,
               output_final_state: bool, l2norm: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The module docstring's recurrence, token by token, in float64; ``o`` in q's dtype."""
    dtype = q.dtype
    q, k, v = (t.double() for t in (q, k, v))
    if l2norm:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, n, h, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    if initial_state is not None:
        state = state + initial_state.double()
    outs = []
    for t in range(n):
        if g is not None:
            state = state * g[:, t].double().exp()[..., None, None]
        kt, vt = k[:, t], v[:, t]  # (B, H, K), (B, H, V)
        if beta is not None:
            vt = beta[:, t].double()[..., None] * (vt - (kt.unsqueeze(-1) * state).sum(-2))
        state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        outs.append(scale * (q[:, t].unsqueeze(-1) * state).sum(-2))
    return torch.stack(outs, dim=1).to(dtype), state if output_final_state else None


def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
               output_final_state=False, **kwargs):
    """``chunk_simple_gla``'s signature and recurrence (``g_gamma`` not modelled)."""
    assert g_gamma is None and not kwargs
    _fla_constraints(q, k, v, delta=False)
    return recurrence(q, k, v, g, None, scale, initial_state, output_final_state, False)


def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs):
    """``chunk_delta_rule``'s signature and recurrence."""
    assert not kwargs and beta.dim() == 3
    _fla_constraints(q, k, v, delta=True)
    return recurrence(q, k, v, None, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, **kwargs):
    """``chunk_gated_delta_rule``'s signature and recurrence (log-space ``g``, no in-kernel
    gate)."""
    assert not kwargs and beta.dim() == 3 and g.dim() == 3
    _fla_constraints(q, k, v, delta=True)
    return recurrence(q, k, v, g, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel)


MODEL_OPS = FlaOps(simple_gla, delta_rule, gated_delta_rule, "model")
