"""Alternating least squares (ALS) for a LLoPS pair: the data-driven start of its fit.

A LLoPS map is φ(x) = Σ_r Π_j (x Θ_{r,j}) (``theta`` ``(t, p, d, m)``). With everything but
one factor j of one side fixed, the estimate Â = Φ_Q Φ_Kᵀ is linear in that factor (all t
ranks together), so minimising ‖Â − A‖_F² over it is a linear least-squares problem. For the
query side, with F = Φ_K (n_k, m), G = FᵀF and P_r = Π_{j'≠j} (Q Θ_{r,j'}) (n_q, m), its
normal equations are, for every rank r,

    Qᵀ[P_r ⊙ (Φ_Q(Θ) G)] = Qᵀ[P_r ⊙ (A F)],   Φ_Q(Θ) = Σ_r (Q Θ_r) ⊙ P_r,

solved by preconditioned conjugate gradients (CG) from the current factor, so the loss never
rises. The preconditioner is the block diagonal's Kronecker approximation (QᵀQ) ⊗ diag(w),
w_{r,c} = mean_i P_r[i, c]² G_cc. A sweep updates every factor of the query side, then of the
key side; after each factor the factors' scales are rebalanced (per column and rank, equal
norms over j; per column, equal ‖Φ_Q[:, c]‖ and ‖Φ_K[:, c]‖), which leaves Â unchanged. A CP
rank t > 1 first fits rank 1 alone, then grows the other ranks from it (:func:`als_start`).
Given held-back validation pairs, the sweeps keep the factors of least validation loss and
stop once ``patience`` sweeps in a row find none lower (early stopping, as the Adam fits do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from arbench.featuremaps import LLoPS

Log = Callable[[str], None]
Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Validation queries ``(nq, d)``, keys ``(nk, d)`` and their target ``(nq, nk)``."""


@dataclass
class ALSResult:
    """Relative squared Frobenius loss ‖Â − A‖²/‖A‖² on the fitted pairs before the first and
    after each sweep, and last, where the returned factors are not the last sweep's (validation
    stop, rank-1 fit kept), theirs; ``val_losses`` the same on the validation pairs (empty
    without them). ``stopped``: ``"converged"`` (a sweep gained less than ``tol``, relative),
    ``"validation"`` (``patience`` sweeps without a new least validation loss) or
    ``"max sweeps"``."""

    losses: list[float] = field(default_factory=list)
    sweeps: int = 0
    stopped: str = ""
    val_losses: list[float] = field(default_factory=list)


def projections(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """x Θ_{r,j} for every rank and factor: ``(n, d)``, ``(t, p, d, m)`` -> ``(t, p, n, m)``."""
    return torch.einsum("nd,rjdm->rjnm", x, theta)


def features(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """φ(x) = Σ_r Π_j x Θ_{r,j}: ``(n, d)`` -> ``(n, m)`` (the reference form of LLoPS)."""
    return projections(x, theta).prod(dim=1).sum(dim=0)


def relative_loss(phi_q: torch.Tensor, phi_k: torch.Tensor, a: torch.Tensor) -> float:
    """‖Φ_Q Φ_Kᵀ − A‖²_F / ‖A‖²_F for ``(nq, m)``, ``(nk, m)`` features and ``(nq, nk)`` A."""
    return float((phi_q @ phi_k.T - a).pow(2).sum() / a.pow(2).sum())


def _others(proj: torch.Tensor, j: int) -> torch.Tensor:
    """P_r = Π_{j'≠j} proj[r, j'] ``(t, n, m)`` (ones for p = 1)."""
    keep = [i for i in range(proj.shape[1]) if i != j]
    return proj[:, keep].prod(dim=1) if keep else torch.ones_like(proj[:, 0])


def weighted_features(x: torch.Tensor, theta: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """Σ_r (x Θ_r) ⊙ P_r: ``(n, d)``, ``(t, d, m)``, ``(t, n, m)`` -> ``(n, m)``
    (reference form; :func:`normal_matvec` computes it by row blocks)."""
    return (torch.einsum("nd,rdm->rnm", x, theta) * others).sum(dim=0)


def normal_matvec_reference(x: torch.Tensor, others: torch.Tensor, gram: torch.Tensor,
                            theta: torch.Tensor) -> torch.Tensor:
    """The factor subproblem's normal operator, Θ ↦ Qᵀ[P_r ⊙ ((Σ_r' (Q Θ_r') ⊙ P_r') G)]
    for every rank r: ``(n, d)``, ``(t, n, m)``, ``(m, m)``, ``(t, d, m)`` -> ``(t, d, m)``."""
    phi = weighted_features(x, theta, others)
    return torch.einsum("nd,rnm->rdm", x, others * (phi @ gram))


RowBlock = tuple[int, torch.Tensor]


def row_blocks(others: torch.Tensor, budget: int = 1 << 19) -> list[RowBlock]:
    """P ``(t, n, m)`` as contiguous row blocks ``(start, (b, t, m))`` of about ``budget`` bytes
    each (cache-sized; at least one row)."""
    t, n, m = others.shape
    rows = max(1, budget // max(1, t * m * others.element_size()))
    by_row = others.permute(1, 0, 2)
    return [(start, by_row[start:start + rows].contiguous()) for start in range(0, n, rows)]


def _accumulate(out: torch.Tensor, x_rows: torch.Tensor, block: torch.Tensor,
                g_rows: torch.Tensor) -> None:
    """out ``(d, t·m)`` += x_rowsᵀ [P_rows ⊙ g_rows] for one row block ``(b, t, m)``."""
    out.addmm_(x_rows.T, (block * g_rows[:, None, :]).flatten(1))


def _unflatten(out: torch.Tensor, t: int) -> torch.Tensor:
    """``(d, t·m)`` -> ``(t, d, m)``."""
    return out.view(out.shape[0], t, -1).permute(1, 0, 2).contiguous()


def weight_back(x: torch.Tensor, blocks: list[RowBlock], g: torch.Tensor) -> torch.Tensor:
    """Xᵀ[P_r ⊙ g] for every rank r, one row block at a time: ``x`` ``(n, d)``, ``blocks`` of P
    (:func:`row_blocks`), ``g`` ``(n, m)`` -> ``(t, d, m)``."""
    t, m = blocks[0][1].shape[1:]
    out = torch.zeros(x.shape[1], t * m, dtype=g.dtype)
    for start, block in blocks:
        rows = slice(start, start + block.shape[0])
        _accumulate(out, x[rows], block, g[rows])
    return _unflatten(out, t)


def normal_matvec(x: torch.Tensor, blocks: list[RowBlock], gram: torch.Tensor,
                  theta: torch.Tensor) -> torch.Tensor:
    """:func:`normal_matvec_reference` one row block of P at a time (rows are independent up
    to the final sum over them), so every temporary stays cache-sized and P is read once;
    ``blocks`` = :func:`row_blocks` of P."""
    t, d, m = theta.shape
    flat = theta.permute(1, 0, 2).reshape(d, t * m)
    out = torch.zeros(d, t * m, dtype=theta.dtype)
    for start, block in blocks:
        x_rows = x[start:start + block.shape[0]]
        phi = (x_rows @ flat).view(-1, t, m).mul_(block).sum(dim=1)
        _accumulate(out, x_rows, block, phi @ gram)
    return _unflatten(out, t)


def solve_factor(x: torch.Tensor, others: torch.Tensor, gram: torch.Tensor, rhs_af: torch.Tensor,
                 start: torch.Tensor, iters: int, ridge: float = 1e-10) -> torch.Tensor:
    """Factor Θ_j ``(t, d, m)`` minimising ‖(Σ_r (x Θ_r) ⊙ P_r) Fᵀ − A‖²_F by preconditioned CG.

    ``x`` ``(n, d)``; ``others`` = P ``(t, n, m)``; ``gram`` = FᵀF ``(m, m)``; ``rhs_af`` = A F
    ``(n, m)``; ``start``: the current factor, where CG begins (``iters`` steps at most).
    """
    blocks = row_blocks(others)

    def apply(theta: torch.Tensor) -> torch.Tensor:
        return normal_matvec(x, blocks, gram, theta)

    b = weight_back(x, blocks, rhs_af)
    cov = x.T @ x
    cov = cov + (ridge * cov.diagonal().mean().clamp_min(1e-300)) * torch.eye(
        cov.shape[0], dtype=cov.dtype)
    chol = torch.linalg.cholesky(cov)
    weight = (others.pow(2).mean(dim=1) * gram.diagonal()).clamp_min(1e-300)  # (t, m)

    def precondition(res: torch.Tensor) -> torch.Tensor:
        flat = res.permute(1, 0, 2).reshape(res.shape[1], -1)
        solved = torch.cholesky_solve(flat, chol).reshape(res.shape[1], res.shape[0], -1)
        return solved.permute(1, 0, 2) / weight[:, None, :]

    theta = start.clone()
    res = b - apply(theta)
    z = precondition(res)
    direction = z.clone()
    rz = (res * z).sum()
    b_norm = float(b.norm())
    for _ in range(iters):
        if b_norm == 0 or float(res.norm()) <= 1e-12 * b_norm:
            break
        h = apply(direction)
        curv = (direction * h).sum()
        if not curv > 0:
            break
        step = rz / curv
        theta = theta + step * direction
        res = res - step * h
        z = precondition(res)
        rz_new = (res * z).sum()
        direction = z + (rz_new / rz) * direction
        rz = rz_new
    return theta


def balance_factors(theta: torch.Tensor) -> torch.Tensor:
    """Equal norms ‖Θ_{r,j}[:, c]‖ over j for every rank r and column c (same φ)."""
    norms = theta.norm(dim=2, keepdim=True).clamp_min(1e-300)  # (t, p, 1, m)
    mean = norms.log().mean(dim=1, keepdim=True).exp()
    return theta * (mean / norms)


def balance_sides(theta_q: torch.Tensor, theta_k: torch.Tensor, q: torch.Tensor,
                  k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale column c by s_c on the query side and 1/s_c on the key side so that
    ‖Φ_Q[:, c]‖ = ‖Φ_K[:, c]‖ (same Â)."""
    p = theta_q.shape[1]
    nq = features(q, theta_q).norm(dim=0).clamp_min(1e-300)
    nk = features(k, theta_k).norm(dim=0).clamp_min(1e-300)
    s = (nk / nq).sqrt() ** (1.0 / p)
    return theta_q * s, theta_k / s


def _val_loss(theta_q: torch.Tensor, theta_k: torch.Tensor, val: Pairs) -> float:
    q, k, a = val
    return relative_loss(features(q, theta_q), features(k, theta_k), a)


def als_sweeps(theta_q: torch.Tensor, theta_k: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               a: torch.Tensor, sweeps: int, cg_iters: int = 25, tol: float = 1e-4,
               log: Log | None = None, label: str = "", val: Pairs | None = None,
               patience: int = 3) -> tuple[torch.Tensor, torch.Tensor, ALSResult]:
    """Up to ``sweeps`` ALS sweeps on ``theta_q``, ``theta_k`` ``(t, p, d, m)`` against
    ``a`` ``(nq, nk)`` = target(q, k); float64 throughout. Stops once a sweep lowers the
    relative loss by less than ``tol`` of its value. With ``val`` (validation pairs, not
    fitted): returns the factors of least validation loss (the start's included) and also
    stops after ``patience`` sweeps without a new least. Returns the factors and the result."""
    q, k, a = q.double(), k.double(), a.double()
    if val is not None:
        val = (val[0].double(), val[1].double(), val[2].double())
    theta_q, theta_k = balance_sides(balance_factors(theta_q.double()),
                                     balance_factors(theta_k.double()), q, k)
    result = ALSResult(losses=[relative_loss(features(q, theta_q), features(k, theta_k), a)])
    best = None
    if val is not None:
        result.val_losses.append(_val_loss(theta_q, theta_k, val))
        best = (result.val_losses[0], theta_q, theta_k, 0)
    for sweep in range(1, sweeps + 1):
        for side in ("q", "k"):
            x, other, target = (q, features(k, theta_k), a) if side == "q" else \
                (k, features(q, theta_q), a.T)
            theta = theta_q if side == "q" else theta_k
            gram, rhs_af = other.T @ other, target @ other
            for j in range(theta.shape[1]):
                others = _others(projections(x, theta), j)
                new = solve_factor(x, others, gram, rhs_af, theta[:, j], cg_iters)
                theta = theta.clone()
                theta[:, j] = new
                theta = balance_factors(theta)
            if side == "q":
                theta_q = theta
            else:
                theta_k = theta
            theta_q, theta_k = balance_sides(theta_q, theta_k, q, k)
        loss = relative_loss(features(q, theta_q), features(k, theta_k), a)
        result.losses.append(loss)
        result.sweeps = sweep
        if log is not None:
            log(f"  {label}: ALS sweep {sweep} loss {loss:.4g}")
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(f"{label or 'ALS'}: loss is {loss} after sweep {sweep}")
        if best is not None:
            result.val_losses.append(_val_loss(theta_q, theta_k, val))
            if result.val_losses[-1] < best[0]:
                best = (result.val_losses[-1], theta_q, theta_k, sweep)
            elif sweep - best[3] >= patience:
                result.stopped = "validation"
                break
        if result.losses[-2] - loss < tol * result.losses[-2]:
            result.stopped = "converged"
            break
    result.stopped = result.stopped or "max sweeps"
    if best is not None and best[3] != result.sweeps:  # an earlier sweep's factors
        _, theta_q, theta_k, kept = best
        result.losses.append(result.losses[kept])
        result.val_losses.append(result.val_losses[kept])
    return theta_q, theta_k, result


def add_ranks(theta: torch.Tensor, extra: torch.Tensor, scale: float) -> torch.Tensor:
    """Rank-1 factors ``theta`` ``(1, p, d, m)`` and ranks 2..t in the directions of ``extra``
    ``(t − 1, p, d, m)``, each factor column ``scale`` times as long as rank 1's: φ changes by
    O(scale^p) relative, and ALS can grow the new ranks from there."""
    unit = extra / extra.norm(dim=2, keepdim=True).clamp_min(1e-300)
    return torch.cat([theta, unit * (scale * theta.norm(dim=2, keepdim=True))])


def keep_rank_1(one: torch.Tensor, grown: torch.Tensor) -> torch.Tensor:
    """Factors ``(t, p, d, m)``: rank 1 from ``one`` ``(1, p, d, m)``, ranks 2..t zero, so φ
    equals the rank-1 map's exactly (a higher CP rank contains the lower one)."""
    return torch.cat([one, torch.zeros_like(grown[1:])])


@torch.no_grad()
def als_start(phi_q: LLoPS, phi_k: LLoPS, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor,
              sweeps: int, cg_iters: int = 25, tol: float = 1e-4, log: Log | None = None,
              label: str = "", grow: bool = True, grow_scale: float = 0.1,
              val: Pairs | None = None, patience: int = 3) -> ALSResult:
    """Fit the (non-affine, unsquared) LLoPS maps ``phi_q``, ``phi_k`` to ``a`` = target(q, k)
    by :func:`als_sweeps`, from their current parameters; writes the factors back.

    With ``grow`` and CP rank t > 1: first rank 1 alone (the maps' first rank), then all t
    ranks from that fit plus the others at ``grow_scale`` (:func:`add_ranks`), so a higher rank
    starts from (almost) a rank-1 fit. Up to ``sweeps`` each. Growing raises the loss by
    O(grow_scale^p) relative to φ; where the sweeps after it do not win that back (a rank-1 fit
    already near zero loss), the rank-1 fit is kept with the other ranks zero
    (:func:`keep_rank_1`; ``stopped`` says so), so the grown fit never ends above its own rank-1
    stage. That stage is close to, not the same as, the separate t = 1 fit's ALS: a data start's
    spare columns keep the sketch's values, whose scale depends on t, and CG's capped iterations
    make ALS only nearly independent of a start's scale; the polish after it runs per t. So
    t > 1 can end above t = 1 (the study's tables show it where it does). With ``val``
    (validation pairs; :func:`als_sweeps`) each stage keeps its factors of least validation
    loss, and the rank-1 fit is kept where the grown one ends above it on that loss instead.
    """
    if phi_q.affine or phi_q.square or phi_k.affine or phi_k.square:
        raise ValueError("ALS supports plain LLoPS maps (no affine factors, no squaring)")
    theta_q, theta_k = phi_q.theta, phi_k.theta
    first = None
    if grow and theta_q.shape[0] > 1:
        one_q, one_k, first = als_sweeps(theta_q[:1], theta_k[:1], q, k, a, sweeps, cg_iters,
                                         tol, log, f"{label} rank 1", val, patience)
        theta_q = add_ranks(one_q, theta_q[1:].double(), grow_scale)
        theta_k = add_ranks(one_k, theta_k[1:].double(), grow_scale)
    theta_q, theta_k, result = als_sweeps(theta_q, theta_k, q, k, a, sweeps, cg_iters, tol, log,
                                          label, val, patience)
    if first is not None:
        stopped = result.stopped
        ends = result.val_losses or result.losses  # the loss that decides
        if ends[-1] > (first.val_losses or first.losses)[-1]:  # growing did not pay
            theta_q, theta_k = keep_rank_1(one_q, theta_q), keep_rank_1(one_k, theta_k)
            result.losses.append(first.losses[-1])
            if result.val_losses:
                result.val_losses.append(first.val_losses[-1])
            stopped += ", rank-1 fit kept"
        result = ALSResult(first.losses + result.losses, first.sweeps + result.sweeps, stopped,
                           first.val_losses + result.val_losses)
    phi_q.theta.copy_(theta_q.to(phi_q.theta.dtype))
    phi_k.theta.copy_(theta_k.to(phi_k.theta.dtype))
    return result
