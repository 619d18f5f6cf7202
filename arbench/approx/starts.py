"""Data-driven starts: maps whose best fit can be approached without gradient steps.

- LLoPS (plain): alternating least squares over its CP factors (:mod:`arbench.approx.als`),
  ``"als"``, from the BASED-style start below written as LLoPS rank-1 factors
  (:func:`monomial_factors`; ``StartConfig.llops_from = "projection"``, the default) or from its
  random sketch start (``"sketch"``). A degree-p monomial of x W is a product of p linear forms
  of x, so the C(r + p − 1, p) ≤ m features of the best rank-r projection's exact expansion are
  rank-1 LLoPS features: ALS starts where BASED-style starts, and only lowers the loss.
- BASED-style (:class:`~arbench.approx.methods.ProjectedPower`): the projections that make
  (q W_Q)·(k W_K) the best rank-r approximation of q·k over the training pairs
  (:func:`bilinear_start`), ``"svd"``.

Other maps (MLP, Flatten, method configs) have none: :func:`data_start` returns ``None`` and
they start with Adam (:mod:`arbench.approx.fit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from arbench.approx.als import Pairs, als_start
from arbench.approx.methods import KernelPair, ProjectedPower, based_rank
from arbench.approx.target import monomials
from arbench.featuremaps import LLoPS

Log = Callable[[str], None]


@dataclass(frozen=True)
class StartConfig:
    """ALS settings: at most ``sweeps`` sweeps (per stage with ``grow``), stop once one gains
    less than ``tol`` (relative), ``cg_iters`` conjugate-gradient steps per factor; ``grow``:
    see :func:`arbench.approx.als.als_start`."""

    sweeps: int = 50
    tol: float = 1e-4
    cg_iters: int = 25
    grow: bool = True  # rank t > 1: rank 1 first, then the others from it
    grow_scale: float = 0.1
    llops_from: str = "projection"  # or "sketch": where LLoPS's rank 1 starts (module docstring)
    spare_scale: float = 0.01  # "projection": columns past the monomials keep this × the sketch


LLOPS_STARTS = ("projection", "sketch")


@dataclass
class StartResult:
    """Which start ran (``"als"``, ``"als from projection r=…"`` or ``"svd"``), its steps (ALS
    sweeps; 0 for the SVD), why it ended and (ALS) the relative training loss before and
    after."""

    name: str
    steps: int = 0
    stopped: str = ""
    first_loss: float = float("nan")  # relative loss on the training pairs before and after
    last_loss: float = float("nan")


def _inv_sqrt_and_sqrt(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C^{-1/2} and C^{1/2} of a PSD ``(d, d)`` matrix (eigenvalues ≤ 1e-12·max read as 0)."""
    evals, evecs = torch.linalg.eigh(cov)
    keep = evals > 1e-12 * evals.max().clamp_min(1e-300)
    root = torch.where(keep, evals.clamp_min(0), torch.zeros_like(evals)).sqrt()
    inv = torch.where(keep, 1 / root.clamp_min(1e-300), torch.zeros_like(root))
    return (evecs * inv) @ evecs.T, (evecs * root) @ evecs.T


def bilinear_start(q: torch.Tensor, k: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K ``(d, r)`` minimising Σ_{i,l} (q_i·k_l − (q_i W_Q)·(k_l W_K))² over the
    ``(nq, d)`` × ``(nk, d)`` pairs: with C_Q = QᵀQ, C_K = KᵀK and U S Vᵀ the SVD of
    C_Q^{1/2} C_K^{1/2}, W_Q = C_Q^{-1/2} U_r S_r^{1/2}, W_K = C_K^{-1/2} V_r S_r^{1/2}."""
    q64, k64 = q.double(), k.double()
    inv_q, root_q = _inv_sqrt_and_sqrt(q64.T @ q64 / len(q64))
    inv_k, root_k = _inv_sqrt_and_sqrt(k64.T @ k64 / len(k64))
    u, s, vh = torch.linalg.svd(root_q @ root_k)
    half = s[:r].sqrt()
    return inv_q @ (u[:, :r] * half), inv_k @ (vh[:r].T * half)


def monomial_factors(w: torch.Tensor, p: int) -> torch.Tensor:
    """LLoPS rank-1 factors ``(p, d, C(r + p − 1, p))`` whose features are the projected map's
    ψ_p(x W) (:class:`~arbench.approx.methods.ProjectedPower`) exactly: the feature of the
    monomial Π_j (x W)_{i_j} has factor j = W[:, i_j], each scaled by the monomial's weight
    √(p!/Π c_i!) to the power 1/p. ``w`` ``(d, r)``."""
    index, weight = monomials(w.shape[1], p)
    scale = weight.to(w.dtype) ** (1.0 / p)  # (D,)
    return torch.stack([w[:, index[:, j]] * scale for j in range(p)])


@torch.no_grad()
def embed_projection(phi_q: LLoPS, phi_k: LLoPS, q: torch.Tensor, k: torch.Tensor,
                     spare_scale: float) -> int:
    """Set rank 1 of ``phi_q``, ``phi_k`` (``theta`` ``(t, p, d, m)``) to the best rank-r bilinear
    projections' exact degree-p expansion (:func:`bilinear_start`, :func:`monomial_factors`),
    r the largest with C(r + p − 1, p) ≤ m; the remaining columns keep ``spare_scale`` times
    their sketch values, so ALS can still use them. Returns r."""
    p, m = phi_q.theta.shape[1], phi_q.theta.shape[3]
    r = based_rank(m, p)
    w_q, w_k = bilinear_start(q, k, r)
    for phi, w in ((phi_q, w_q), (phi_k, w_k)):
        factors = monomial_factors(w, p).to(phi.theta.dtype)
        used = factors.shape[2]
        phi.theta[0, :, :, :used] = factors
        phi.theta[0, :, :, used:] *= spare_scale
    return r


def start_name(pair: KernelPair) -> str | None:
    """``"als"`` or ``"svd"`` when :func:`data_start` has a start for ``pair``, else ``None``."""
    phi_q, phi_k = pair.phi_q, pair.phi_k
    if isinstance(phi_q, LLoPS) and isinstance(phi_k, LLoPS) and not (
            phi_q.affine or phi_q.square or phi_k.affine or phi_k.square):
        return "als"
    if isinstance(phi_q, ProjectedPower) and isinstance(phi_k, ProjectedPower):
        return "svd"
    return None


@torch.no_grad()
def data_start(pair: KernelPair, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor,
               config: StartConfig, log: Log | None = None, label: str = "",
               val: Pairs | None = None, patience: int = 3) -> StartResult | None:
    """Set ``pair``'s parameters from the training ``q`` ``(nq, d)``, ``k`` ``(nk, d)`` and
    ``a`` = target(q, k) ``(nq, nk)`` when the map has a data-driven start; else ``None``.
    ``val``, ``patience``: ALS's validation stop (:func:`arbench.approx.als.als_sweeps`)."""
    phi_q, phi_k = pair.phi_q, pair.phi_k
    name = start_name(pair)
    if name == "als":
        how = "als"
        if config.llops_from == "projection":
            how += f" from projection r={embed_projection(phi_q, phi_k, q, k, config.spare_scale)}"
        result = als_start(phi_q, phi_k, q, k, a, config.sweeps, config.cg_iters, config.tol,
                           log, label, config.grow, config.grow_scale, val, patience)
        return StartResult(how, result.sweeps, result.stopped, result.losses[0],
                           result.losses[-1])
    if name == "svd":
        w_q, w_k = bilinear_start(q, k, phi_q.proj.shape[1])
        phi_q.proj.copy_(w_q.to(phi_q.proj.dtype))
        phi_k.proj.copy_(w_k.to(phi_k.proj.dtype))
        return StartResult("svd")
    return None
