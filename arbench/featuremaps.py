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

import contextlib
import math
from collections.abc import Iterator

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


CP_BLOCK_ROWS = 512
"""Rows per block of :func:`cp_polynomial` on a CPU (0: all rows in one block). A block's
projections ``(rows, p·t·m)`` are multiplied out while they are still in cache instead of in
passes over the whole sequence. ``python -m arbench.bench`` times 0, 512, 1024 and 2048 rows
(table in ``results/bench/bench.md``) and runs with the fastest; :func:`cp_block_rows` sets it."""


@contextlib.contextmanager
def cp_block_rows(rows: int) -> Iterator[None]:
    """Run :func:`cp_polynomial` with blocks of ``rows`` rows (0: one block) inside the block."""
    global CP_BLOCK_ROWS
    if not isinstance(rows, int) or rows < 0:
        raise ValueError(f"cp block rows must be an integer >= 0, got {rows!r}")
    old, CP_BLOCK_ROWS = CP_BLOCK_ROWS, rows
    try:
        yield
    finally:
        CP_BLOCK_ROWS = old


def _product_into(out: torch.Tensor, factors: torch.Tensor) -> None:
    """``out = Π_j factors[:, j]``; ``factors``: ``(rows, p, w)``, ``out``: ``(rows, w)``."""
    torch.mul(factors[:, 0], factors[:, 1], out=out)
    for j in range(2, factors.shape[1]):
        out.mul_(factors[:, j])


def _product_grad_into(grad: torch.Tensor, factors: torch.Tensor, grad_out: torch.Tensor,
                       suffix: torch.Tensor) -> None:
    """``grad[:, j] = grad_out · Π_{i≠j} factors[:, i]`` without a stack of p tensors.

    Prefix products go into ``grad``, then a running suffix product (in ``suffix``, a
    ``(rows, w)`` scratch buffer) multiplies them in place. ``grad``, ``factors``: ``(rows, p, w)``.
    """
    p = factors.shape[1]
    grad[:, 1].copy_(factors[:, 0])
    for j in range(2, p):
        torch.mul(grad[:, j - 1], factors[:, j - 1], out=grad[:, j])  # Π_{i<j} f_i
    suffix.copy_(grad_out)
    for j in range(p - 1, 0, -1):
        grad[:, j].mul_(suffix)  # × grad_out · Π_{i>j} f_i
        if j > 1:
            suffix.mul_(factors[:, j])
    torch.mul(suffix, factors[:, 1], out=grad[:, 0])


def _cp_forward(x: torch.Tensor, w: torch.Tensor, p: int, rank: int, block: int,
                keep: torch.Tensor | None) -> torch.Tensor:
    """Σ_r Π_j of ``x @ w`` block by block. ``x``: ``(rows, d)``; ``w``: ``(d, p·rank·m)``,
    factor-major; returns ``(rows, m)``. The projections go into ``keep`` (``(rows, p·rank·m)``,
    for the backward pass) or, when it is None, into one reused block buffer."""
    n, width = x.shape[0], w.shape[1] // p
    m = width // rank
    out = x.new_empty(n, m)
    scratch = x.new_empty(min(block, n), p * width) if keep is None else None
    prod = x.new_empty(min(block, n), width) if rank > 1 else None
    for i in range(0, n, block):
        j = min(i + block, n)
        proj = keep[i:j] if keep is not None else scratch[: j - i]
        torch.mm(x[i:j], w, out=proj)
        factors = proj.view(j - i, p, width)
        if rank == 1:
            _product_into(out[i:j], factors)
        else:
            _product_into(prod[: j - i], factors)
            torch.sum(prod[: j - i].view(j - i, rank, m), dim=1, out=out[i:j])
    return out


class _BlockedCP(torch.autograd.Function):
    """:func:`cp_polynomial` on ``(rows, d)`` inputs with a blocked backward.

    Saves the input, the weights and the projections (as autograd would) and computes, block by
    block, the factors' gradients into one buffer, then ``∂x`` (a matmul into the block's rows)
    and ``∂w`` (accumulated with ``addmm_``).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, p: int, rank: int,  # type: ignore[override]
                block: int) -> torch.Tensor:
        keep = x.new_empty(x.shape[0], w.shape[1])
        out = _cp_forward(x, w, p, rank, block, keep)
        ctx.save_for_backward(x, w, keep)
        ctx.shape = (p, rank, block)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        x, w, proj = ctx.saved_tensors
        p, rank, block = ctx.shape
        n, width = x.shape[0], w.shape[1] // p
        m = width // rank
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_x = torch.empty_like(x) if need_x else None
        grad_w = torch.zeros_like(w) if need_w else None
        rows = min(block, n)
        grad = x.new_empty(rows, p, width)
        suffix = x.new_empty(rows, width)
        grad_out = grad_out.contiguous()
        for i in range(0, n, block):
            j = min(i + block, n)
            g_out = grad_out[i:j]
            if rank > 1:  # the rank sum passes the same gradient to every rank
                g_out = g_out.unsqueeze(1).expand(j - i, rank, m).reshape(j - i, width)
            g = grad[: j - i]
            _product_grad_into(g, proj[i:j].view(j - i, p, width), g_out, suffix[: j - i])
            g = g.view(j - i, p * width)
            if grad_x is not None:
                torch.mm(g, w.t(), out=grad_x[i:j])
            if grad_w is not None:
                grad_w.addmm_(x[i:j].t(), g)
        return grad_x, grad_w, None, None, None


def _cp_unblocked(x: torch.Tensor, w: torch.Tensor, p: int, rank: int) -> torch.Tensor:
    """The same sum of products in plain tensor ops (for ``torch.compile`` and GPUs)."""
    factors = (x @ w).unflatten(-1, (p, w.shape[1] // p))
    out = factors[..., 0, :]
    for j in range(1, p):
        out = out * factors[..., j, :]
    return out.unflatten(-1, (rank, -1)).sum(dim=-2)


def cp_polynomial(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Σ_r Π_j x Θ_{j,r} with ``theta`` of shape ``(rank, p, d, m)``.

    One matmul of x against all ``rank·p`` projections concatenated (factor-major, so factor j
    of every rank is one contiguous block of ``rank·m`` columns), a product over p and a sum
    over rank. On a CPU the rows go through in blocks of :data:`CP_BLOCK_ROWS` (forward and a
    hand-written backward, :class:`_BlockedCP`); under ``torch.compile`` and on GPUs the plain
    tensor form is used, which the compiler or the device's bandwidth handles well.
    ``x``: ``(..., d)``; returns ``(..., m)``.
    """
    rank, p, d, m = theta.shape
    w = theta.permute(2, 1, 0, 3).reshape(d, p * rank * m)  # (d, p*rank*m)
    if p == 1:
        return (x @ w).unflatten(-1, (rank, m)).sum(dim=-2)
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return _cp_unblocked(x, w, p, rank)
    x2 = x.reshape(-1, d).contiguous()
    w = w.to(x2.dtype).contiguous()
    block = CP_BLOCK_ROWS or max(x2.shape[0], 1)
    if torch.is_grad_enabled() and (x.requires_grad or theta.requires_grad):
        out = _BlockedCP.apply(x2, w, p, rank, block)
    else:
        out = _cp_forward(x2, w, p, rank, block, None)
    return out.view(*x.shape[:-1], m)


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
