"""The Eckart–Young floor and the optimal linear sketch W* of Theorem 3.1.

For A = (Q Kᵀ)^p = ψ_p(Q) ψ_p(K)ᵀ with SVD U Σ Vᵀ, every m-dimensional feature map pair has
‖φ_Q(Q) φ_K(K)ᵀ − A‖_F² ≥ Σ_{i>m} σ_i², and the bound is reached by linear maps of ψ_p:
W_Q* = ψ_p(Q)⁺ U_m Σ_m^{1/2}, W_K* = ψ_p(K)⁺ V_m Σ_m^{1/2} (minimum-norm least squares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from arbench.approx.metrics import rmae
from arbench.approx.target import check_p, monomial_count, poly_kernel, symmetric_power


@dataclass(frozen=True)
class Floor:
    """Eckart–Young bound of one held-out matrix at rank m."""

    m: int
    rel_frobenius: float  # sqrt(Σ_{i>m} σ_i²) / ‖A‖_F
    sq_error: float  # Σ_{i>m} σ_i²
    rmae: float  # RMAE of the rank-m truncated SVD itself


SQRT_EPS = math.sqrt(torch.finfo(torch.float64).eps)
"""On the eigh path, singular values at or below ``SQRT_EPS · σ_1`` are read as 0."""
EXACT_SVD_MAX = 2048  # larger matrices: the eigendecomposition of a aᵀ (several times faster)


def truncated_svd(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 SVD of ``(nq, nk)`` ``a`` kept to rank m: ``U_m (nq, m), σ (all), V_m (nk, m)``.

    Up to :data:`EXACT_SVD_MAX` rows: ``torch.linalg.svd``. Beyond: σ² and U from
    ``eigh(a aᵀ)`` and V_m = aᵀ U_m / σ_m (accurate for the leading singular values, which are
    all the floor and W* use; σ at or below √eps·σ_1 read as 0, their V columns 0).
    """
    a = a.double()
    if a.shape[0] <= EXACT_SVD_MAX:
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        return u[:, :m], s, vh[:m].T
    evals, evecs = torch.linalg.eigh(a @ a.T)
    s = evals.flip(0).clamp_min(0).sqrt()[:min(a.shape)]
    s = torch.where(s > s[0] * SQRT_EPS, s, torch.zeros_like(s))  # eigh's rounding, not signal
    u = evecs.flip(1)[:, :m]
    kept = s[:m] > 0
    v = (a.T @ u) / torch.where(kept, s[:m], torch.ones_like(s[:m])) * kept
    return u, s, v


def eckart_young(a: torch.Tensor, m: int) -> Floor:
    """Floor of rank-m approximations of ``a`` ``(nq, nk)`` (Frobenius) and the SVD's RMAE."""
    u, s, v = truncated_svd(a, m)
    tail = float((s[m:] ** 2).sum())
    total = float((s ** 2).sum())
    best = (u * s[:m]) @ v.T
    return Floor(m=m, rel_frobenius=math.sqrt(tail / total), sq_error=tail, rmae=rmae(best, a))


def optimal_linear_sketch(q: torch.Tensor, k: torch.Tensor, p: int,
                          m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit W_Q*, W_K* ``(D, m)`` of Theorem 3.1 for ``q`` ``(nq, d)``, ``k`` ``(nk, d)``.

    Built on the symmetric ψ_p (D = C(d + p − 1, p) rows, the same kernel as d^p rows), so
    ``symmetric_power(q, p) @ W_Q*`` times that of k is the rank-m truncated SVD of (q kᵀ)^p.
    """
    psi_q = symmetric_power(q.double(), p)
    psi_k = symmetric_power(k.double(), p)
    u, s, v = truncated_svd(psi_q @ psi_k.T, m)
    root = s[:m].sqrt()
    w_q = torch.linalg.pinv(psi_q) @ (u * root)
    w_k = torch.linalg.pinv(psi_k) @ (v * root)
    return w_q, w_k


def explicit_sketch_kernel(q: torch.Tensor, k: torch.Tensor, p: int, m: int,
                           max_dim: int) -> torch.Tensor | None:
    """ψ_p(q) W_Q* (ψ_p(k) W_K*)ᵀ ``(nq, nk)``; ``None`` when C(d + p − 1, p) > ``max_dim``."""
    if monomial_count(q.shape[-1], check_p(p)) > max_dim:
        return None
    w_q, w_k = optimal_linear_sketch(q, k, p, m)
    return (symmetric_power(q.double(), p) @ w_q) @ (symmetric_power(k.double(), p) @ w_k).T


class _GramFeatures(nn.Module):
    """φ(x) = (x Xᵀ)^p C: ``(n, d)`` -> ``(n, m)``, i.e. ψ_p(x) ψ_p(X)ᵀ C without ψ_p."""

    def __init__(self, anchors: torch.Tensor, coef: torch.Tensor, p: int):
        super().__init__()
        self.p = p
        self.feature_dim = coef.shape[1]
        self.register_buffer("anchors", anchors)
        self.register_buffer("coef", coef)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (poly_kernel(x.double(), self.anchors, self.p) @ self.coef).to(x.dtype)


def fitted_optimal_sketch(q: torch.Tensor, k: torch.Tensor, p: int, m: int,
                          rtol: float = 1e-10) -> tuple[nn.Module, nn.Module]:
    """W* of Theorem 3.1 built on training ``q``, ``k``, as feature maps for new points.

    Uses ψ_p(Q)⁺ = ψ_p(Q)ᵀ G_Q⁺ with the Gram matrix G_Q = (Q Qᵀ)^p, so
    φ_Q(x) = ψ_p(x) W_Q* = (x Qᵀ)^p G_Q⁺ U_m Σ_m^{1/2} for any d and p (no d^p expansion).
    Returns ``(φ_Q, φ_K)``, each ``(n, d) -> (n, m)``.
    """
    q64, k64 = q.double(), k.double()
    u, s, v = truncated_svd(poly_kernel(q64, k64, p), m)
    root = s[:m].sqrt()
    gram_q = torch.linalg.pinv(poly_kernel(q64, q64, p), hermitian=True, rtol=rtol)
    gram_k = torch.linalg.pinv(poly_kernel(k64, k64, p), hermitian=True, rtol=rtol)
    return (_GramFeatures(q64, gram_q @ (u * root), p),
            _GramFeatures(k64, gram_k @ (v * root), p))
