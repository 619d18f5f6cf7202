"""Feature maps φ: ``(..., head_dim) -> (..., feature_dim)`` for linear attention.

Each map is an ``nn.Module`` with a ``feature_dim`` attribute and ``hparams()`` (the numbers a
sweep or a table reports). Queries and keys always get separate instances.

Initialisation of the projections Θ (entries N(0, σ²)), two choices:

- ``temperature=None`` (default of the learned maps LLoPS, Flatten): variance-preserving,
  ``σ² = (t²·m)^(-1/(2p)) / head_dim``. For inputs with unit-variance coordinates every
  projection x Θ_j has variance (t²·m)^(-1/(2p)), each feature variance m^(-1/2), and
  φ(q)·φ(k) has standard deviation ≈ 1 at init, whatever p (checked up to p = 8 in the tests).
- ``temperature=τ`` (PolySketch's default, τ = 1): an unbiased sketch,
  ``σ² = (t·m)^(-1/p) / τ``, so E[φ(q)·φ(k)] = (q·k / τ)^p over random Θ. Its variance grows like
  (|q||k|/τ)^(2p) / (t·m): fine for a sketch of (q·k)^p, too wide to train from at large p.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _require_int(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def sketch_std(head_dim: int, m: int, p: int, rank: int, temperature: float | None) -> float:
    """Entry std of Θ: variance-preserving when ``temperature`` is None, else an unbiased sketch
    of ``(q·k / temperature)^p`` (see the module docstring)."""
    if temperature is None:
        return math.sqrt((rank * rank * m) ** (-0.5 / p) / head_dim)
    return math.sqrt((rank * m) ** (-1.0 / p) / temperature)


class FeatureMap(nn.Module):
    """Base class: maps ``(..., head_dim)`` to ``(..., feature_dim)``."""

    head_dim: int
    feature_dim: int

    def hparams(self) -> dict[str, float | int | str | bool]:
        """Hyperparameters to report (feature map name, m, p, rank, ...)."""
        return {"feature_map": type(self).__name__, "m": self.feature_dim}


class _FactorProduct(torch.autograd.Function):
    """Π_j f_j of ``p`` factors laid side by side: ``(..., p, w) -> (..., w)``.

    Saves only its input (autograd's chain of products would keep p − 2 partial products) and
    writes every factor's gradient g·Π_{i≠j} f_i straight into one ``(..., p, w)`` buffer: prefix
    products go into the buffer, then a running suffix product multiplies them in place, so no
    ``stack`` of p separate gradients (on a CPU that copy cost as much as the products).
    """

    @staticmethod
    def forward(ctx, factors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(factors)
        out = torch.mul(factors.select(-2, 0), factors.select(-2, 1))
        for j in range(2, factors.shape[-2]):
            out.mul_(factors.select(-2, j))
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        (factors,) = ctx.saved_tensors
        p = factors.shape[-2]
        grad = torch.empty(factors.shape, dtype=factors.dtype, device=factors.device)
        f = [factors.select(-2, j) for j in range(p)]
        g = [grad.select(-2, j) for j in range(p)]
        g[1].copy_(f[0])
        for j in range(2, p):
            torch.mul(g[j - 1], f[j - 1], out=g[j])  # g[j] = Π_{i<j} f_i
        suffix = grad_out
        for j in range(p - 1, 0, -1):
            g[j].mul_(suffix)  # × grad_out · Π_{i>j} f_i
            if j > 1:
                suffix = suffix * f[j] if suffix is grad_out else suffix.mul_(f[j])
            else:
                torch.mul(suffix, f[1], out=g[0])
        return grad


def cp_polynomial(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Σ_r Π_j x Θ_{j,r} with ``theta`` of shape ``(rank, p, d, m)``.

    One matmul of x against all ``rank·p`` projections concatenated (factor-major, so factor j
    of every rank is one contiguous block of ``rank·m`` columns), then a product over p
    (:class:`_FactorProduct` when a gradient is needed, in place otherwise) and a sum over rank.
    ``x``: ``(..., d)``; returns ``(..., m)``.
    """
    rank, p, d, m = theta.shape
    proj = x @ theta.permute(2, 1, 0, 3).reshape(d, p * rank * m)  # (..., p*rank*m)
    factors = proj.unflatten(-1, (p, rank * m))  # (..., p, rank*m)
    if p == 1:
        out = factors.squeeze(-2)
    elif torch.is_grad_enabled() and (x.requires_grad or theta.requires_grad):
        out = _FactorProduct.apply(factors)
    else:
        out = torch.mul(factors.select(-2, 0), factors.select(-2, 1))
        for j in range(2, p):
            out.mul_(factors.select(-2, j))
    out = out.unflatten(-1, (rank, m))
    return out.squeeze(-2) if rank == 1 else out.sum(dim=-2)


class LLoPS(FeatureMap):
    """Learnable low-rank polynomial sketch: φ(x) = Σ_{r=1..t} Π_{j=1..p} x Θ_{j,r}.

    ``theta``: ``(rank, p, head_dim, m)``. Equals ψ_p(x) Ŵ with Ŵ = Σ_r Θ_{1,r} ⊙ … ⊙ Θ_{p,r}
    (column-wise Kronecker product) without building the ``d^p`` expansion. ``square=True``
    returns φ(x)² elementwise (non-negative features, a kernel of degree 2p).
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4, rank: int = 1,
                 square: bool = False, temperature: float | None = None):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.m = _require_int("m", m)
        self.p = _require_int("p", p)
        self.rank = _require_int("rank", rank)
        self.square = bool(square)
        self.feature_dim = m
        std = sketch_std(head_dim, m, p, rank, temperature)
        self.theta = nn.Parameter(torch.randn(rank, p, head_dim, m) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = cp_polynomial(x, self.theta)
        return out * out if self.square else out

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "LLoPS", "m": self.m, "p": self.p, "rank": self.rank,
                "square": self.square}


class Flatten(FeatureMap):
    """Elementwise polynomial (Flatten Transformer): φ(x) = (x Θ)^p with one shared ``theta``.

    ``theta``: ``(head_dim, m)``. LLoPS with rank 1 and all Θ_j equal.
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4,
                 temperature: float | None = None):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.m = _require_int("m", m)
        self.p = _require_int("p", p)
        self.feature_dim = m
        std = sketch_std(head_dim, m, p, 1, temperature)
        self.theta = nn.Parameter(torch.randn(head_dim, m) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.theta).pow(self.p)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Flatten", "m": self.m, "p": self.p, "rank": 1}


class Based(FeatureMap):
    """BASED 2nd-order Taylor features of a learned projection x̃ = x W ∈ R^r.

    φ(x) = [1, x̃ / r^{1/4}, vec(x̃ x̃ᵀ) / (√2·√r)], so φ(q)·φ(k) = 1 + s + s²/2 with
    s = q̃·k̃ / √r. ``feature_dim = 1 + r + r²`` (273 for r = 16).
    """

    def __init__(self, head_dim: int, r: int = 16):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.r = _require_int("r", r)
        self.feature_dim = 1 + r + r * r
        self.proj = nn.Linear(head_dim, r, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = self.proj(x)
        r = self.r
        first = xt / r ** 0.25
        scaled = xt / math.sqrt(2.0 * r)  # scale the r-vector, not the r² outer product
        second = (scaled.unsqueeze(-1) * xt.unsqueeze(-2)).flatten(-2)
        ones = torch.ones_like(xt[..., :1])
        return torch.cat([ones, first, second], dim=-1)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Based", "m": self.feature_dim, "r": self.r, "p": 2, "rank": 1}


class PolySketch(FeatureMap):
    """PolySketchFormer's data-independent sketch: φ(x) = Π_j x G_j with fixed Gaussian G_j.

    ``sketch``: buffer ``(1, p, head_dim, m)``, drawn from a generator seeded by ``seed`` (not
    trained, identical for equal seeds). Unbiased for ``(q·k / temperature)^p`` (default 1).
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4, seed: int = 0,
                 temperature: float = 1.0):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.m = _require_int("m", m)
        self.p = _require_int("p", p)
        self.seed = int(seed)
        self.feature_dim = m
        gen = torch.Generator().manual_seed(self.seed)
        std = sketch_std(head_dim, m, p, 1, temperature)
        sketch = torch.randn(1, p, head_dim, m, generator=gen) * std
        self.register_buffer("sketch", sketch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cp_polynomial(x, self.sketch.to(x.dtype))

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "PolySketch", "m": self.m, "p": self.p, "rank": 1}


class EluPlusOne(FeatureMap):
    """φ(x) = elu(x) + 1 (Katharopoulos et al.); ``feature_dim = head_dim``, no parameters."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.elu(x) + 1.0

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "EluPlusOne", "m": self.feature_dim}
