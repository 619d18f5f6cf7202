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

from arbench.precision import CPU_AUTOCAST_DTYPE, accumulator_dtype, kernel_dtype, use_cpu_kernels


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

    Prefix products go into ``grad[:, j]`` (j ≥ 2; factor 0 is its own prefix for j = 1),
    then a running suffix product starting from ``grad_out`` (in ``suffix``, a ``(rows, w)``
    scratch buffer) multiplies them: 3p − 4 multiplications, no copies.
    ``grad``, ``factors``: ``(rows, p, w)``.
    """
    p = factors.shape[1]
    if p > 2:
        torch.mul(factors[:, 0], factors[:, 1], out=grad[:, 2])
    for j in range(3, p):
        torch.mul(grad[:, j - 1], factors[:, j - 1], out=grad[:, j])  # Π_{i<j} f_i
    tail = grad_out  # grad_out · Π_{i>j} f_i
    for j in range(p - 1, 1, -1):
        grad[:, j].mul_(tail)
        torch.mul(tail, factors[:, j], out=suffix)
        tail = suffix
    torch.mul(factors[:, 0], tail, out=grad[:, 1])
    torch.mul(tail, factors[:, 1], out=grad[:, 0])


def _power_into(out: torch.Tensor, y: torch.Tensor, p: int) -> None:
    """``out = y ** p`` for an integer ``p >= 1`` by left-to-right binary powering in ``out``
    (p = 4: two squarings; p = 6: y², y³, y⁶), no scratch and no copy for p ≥ 2.
    ``Tensor.pow`` has fast kernels for p ≤ 3 only; ``pow(4)`` over ``(16384, 256)`` took several
    times two squarings here."""
    if p == 1:
        out.copy_(y)
        return
    bits = bin(p)[3:]  # the bits after the leading one
    torch.mul(y, y, out=out)
    if bits[0] == "1":
        out.mul_(y)
    for bit in bits[1:]:
        out.mul_(out)
        if bit == "1":
            out.mul_(y)


class _CPKind:
    """Σ_r Π_j of the projections: ``(rows, p·rank·m)`` factor-major → ``(rows, m)``."""

    def __init__(self, p: int, rank: int, m: int):
        self.p, self.rank, self.m = p, rank, m
        self.width = rank * m  # columns of one factor j (all ranks)

    def scratch(self, x: torch.Tensor, rows: int) -> list[torch.Tensor]:
        return [x.new_empty(rows, self.width)] if self.rank > 1 else []

    def forward_into(self, out: torch.Tensor, proj: torch.Tensor, scratch: list) -> None:
        rows = proj.shape[0]
        factors = proj.view(rows, self.p, self.width)
        if self.rank == 1:
            _product_into(out, factors)
            return
        prod = scratch[0][:rows]
        _product_into(prod, factors)
        torch.sum(prod.view(rows, self.rank, self.m), dim=1, out=out)

    def grad_scratch(self, x: torch.Tensor, rows: int) -> list[torch.Tensor]:
        return [x.new_empty(rows, self.p * self.width), x.new_empty(rows, self.width)]

    def grad_into(self, proj: torch.Tensor, grad_out: torch.Tensor,
                  scratch: list) -> torch.Tensor:
        rows = proj.shape[0]
        if self.rank > 1:  # the rank sum passes the same gradient to every rank
            grad_out = grad_out.unsqueeze(1).expand(rows, self.rank, self.m).reshape(rows, -1)
        grad = scratch[0][:rows].view(rows, self.p, self.width)
        _product_grad_into(grad, proj.view(rows, self.p, self.width), grad_out,
                           scratch[1][:rows])
        return grad.view(rows, self.p * self.width)


class _PowerKind:
    """The elementwise power ``y^p`` of one projection ``(rows, m)`` (Flatten)."""

    def __init__(self, p: int, m: int):
        self.p, self.m = p, m

    def scratch(self, x: torch.Tensor, rows: int) -> list[torch.Tensor]:
        return []

    def forward_into(self, out: torch.Tensor, proj: torch.Tensor, scratch: list) -> None:
        _power_into(out, proj, self.p)

    def grad_scratch(self, x: torch.Tensor, rows: int) -> list[torch.Tensor]:
        return [x.new_empty(rows, self.m)]

    def grad_into(self, proj: torch.Tensor, grad_out: torch.Tensor,
                  scratch: list) -> torch.Tensor:
        grad = scratch[0][: proj.shape[0]]  # p · y^(p-1) · grad_out
        if self.p == 1:
            return grad.copy_(grad_out)
        _power_into(grad, proj, self.p - 1)
        return grad.mul_(grad_out).mul_(float(self.p))


_Kind = _CPKind | _PowerKind


def _blocked_forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, kind: _Kind,
                     m: int, block: int, keep: torch.Tensor | None) -> torch.Tensor:
    """``kind`` applied to ``x @ w (+ bias)`` block by block. ``x``: ``(rows, d)``; ``w``:
    ``(d, k)``; ``bias``: ``(k,)`` or None; returns ``(rows, m)``. The projections go into
    ``keep`` (``(rows, k)``, for the backward pass) or, when it is None, into one reused block
    buffer."""
    n = x.shape[0]
    out = x.new_empty(n, m)
    buf = x.new_empty(min(block, n), w.shape[1]) if keep is None else None
    scratch = kind.scratch(x, min(block, n))
    for i in range(0, n, block):
        j = min(i + block, n)
        proj = keep[i:j] if keep is not None else buf[: j - i]
        if bias is None:
            torch.mm(x[i:j], w, out=proj)
        else:
            torch.addmm(bias, x[i:j], w, out=proj)
        kind.forward_into(out[i:j], proj, scratch)
    return out


class _BlockedMap(torch.autograd.Function):
    """A feature map ``kind(x @ w)`` on ``(rows, d)`` inputs, blocked forward and backward.

    Saves the input, the weights and the projections (as autograd would) and computes, block by
    block, the projections' gradient (``kind.grad_into``), then ``∂x`` (a matmul into the
    block's rows) and ``∂w`` (summed over blocks in an fp32 accumulator, returned in fp32).

    Autocast: inputs are cast to bf16 and the whole map runs in bf16 (projections and the product
    over p). Measured on random inputs (tests/test_precision.py), the product of p bf16 factors
    is within a few bf16 roundings of the fp32 map: an fp32 product of the same bf16 projections
    is no closer, because the projections' own rounding dominates.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, kind: _Kind, m: int, block: int) -> torch.Tensor:
        keep = x.new_empty(x.shape[0], w.shape[1])
        out = _blocked_forward(x, w, bias, kind, m, block, keep)
        ctx.save_for_backward(x, w, keep)
        ctx.kind, ctx.block = kind, block
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        x, w, proj = ctx.saved_tensors
        kind, block, n = ctx.kind, ctx.block, x.shape[0]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = torch.empty_like(x) if need_x else None
        acc = accumulator_dtype(x)
        low = x.dtype != acc  # bf16: sum the blocks' ∂w in fp32
        grad_w = torch.zeros_like(w, dtype=acc) if need_w else None
        grad_b = w.new_zeros(w.shape[1], dtype=acc) if need_b else None
        scratch = kind.grad_scratch(x, min(block, n))
        grad_out = grad_out.to(x.dtype).contiguous()
        for i in range(0, n, block):
            j = min(i + block, n)
            g = kind.grad_into(proj[i:j], grad_out[i:j], scratch)
            if grad_x is not None:
                torch.mm(g, w.t(), out=grad_x[i:j])
            if grad_w is not None and low:
                grad_w.add_(x[i:j].t() @ g)
            elif grad_w is not None:
                grad_w.addmm_(x[i:j].t(), g)
            if grad_b is not None:
                grad_b.add_(g.sum(0, dtype=acc))
        return grad_x, grad_w, grad_b, None, None, None


def _blocked_map(x: torch.Tensor, w: torch.Tensor, kind: _Kind, m: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """``kind(x @ w + bias)`` for ``x``: ``(..., d)``, ``w``: ``(d, k)``, ``bias``: ``(k,)`` or
    None on a CPU, in blocks of :data:`CP_BLOCK_ROWS` rows (with :class:`_BlockedMap` when a
    gradient is needed); returns ``(..., m)``."""
    d = w.shape[0]
    dtype = kernel_dtype(x)  # bf16 under autocast, as the Function's custom_fwd casts
    x2 = x.reshape(-1, d).to(dtype).contiguous()
    w = w.to(dtype).contiguous()
    bias = None if bias is None else bias.to(dtype).contiguous()
    block = CP_BLOCK_ROWS or max(x2.shape[0], 1)
    if torch.is_grad_enabled() and (x2.requires_grad or w.requires_grad or (
            bias is not None and bias.requires_grad)):
        out = _BlockedMap.apply(x2, w, bias, kind, m, block)
    else:
        out = _blocked_forward(x2, w, bias, kind, m, block, None)
    return out.view(*x.shape[:-1], m)


def _cp_unblocked(x: torch.Tensor, w: torch.Tensor, p: int, rank: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same sum of products in plain tensor ops (for ``torch.compile`` and GPUs)."""
    proj = x @ w if bias is None else x @ w + bias
    factors = proj.unflatten(-1, (p, w.shape[1] // p))
    out = factors[..., 0, :]
    for j in range(1, p):
        out = out * factors[..., j, :]
    return out.unflatten(-1, (rank, -1)).sum(dim=-2)


def cp_polynomial(x: torch.Tensor, theta: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_r Π_j (x Θ_{j,r} + c_{j,r}) with ``theta`` of shape ``(rank, p, d, m)`` and ``bias``
    (the constants c, affine factors) of shape ``(rank, p, m)`` or None (c = 0).

    One matmul of x against all ``rank·p`` projections concatenated (factor-major, so factor j
    of every rank is one contiguous block of ``rank·m`` columns), a product over p and a sum
    over rank. On a CPU the rows go through in blocks of :data:`CP_BLOCK_ROWS` (forward and a
    hand-written backward, :class:`_BlockedMap`); under ``torch.compile`` and on GPUs the plain
    tensor form is used. ``x``: ``(..., d)``; returns ``(..., m)``.
    """
    rank, p, d, m = theta.shape
    w = theta.permute(2, 1, 0, 3).reshape(d, p * rank * m)  # (d, p*rank*m)
    b = None if bias is None else bias.permute(1, 0, 2).reshape(p * rank * m)  # same order
    if p == 1 or not use_cpu_kernels(x):
        return _cp_unblocked(x, w, p, rank, b)
    return _blocked_map(x, w, _CPKind(p, rank, m), m, b)


def _int_power(y: torch.Tensor, p: int) -> torch.Tensor:
    """``y ** p`` for an integer ``p >= 1`` in traced tensor ops (for ``torch.compile`` and
    GPUs): the left-to-right powering of :func:`_power_into`, out of place."""
    out = y
    for bit in bin(p)[3:]:  # the bits after the leading one
        out = out * out
        if bit == "1":
            out = out * y
    return out


def power_map(x: torch.Tensor, w: torch.Tensor, p: int) -> torch.Tensor:
    """``(x @ w) ** p`` elementwise. ``x``: ``(..., d)``, ``w``: ``(d, m)``; returns ``(..., m)``.

    On a CPU in row blocks with a hand-written backward ``∂y = p·y^(p−1)·∂out``
    (:class:`_BlockedMap`), the power by squarings; elsewhere the plain tensor form.
    """
    if p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if not use_cpu_kernels(x):
        return _int_power(x @ w, p)
    return _blocked_map(x, w, _PowerKind(p, w.shape[1]), w.shape[1])


class LLoPS(FeatureMap):
    """Learnable low-rank polynomial sketch: φ(x) = Σ_{r=1..t} Π_{j=1..p} x Θ_{j,r}.

    ``theta``: ``(rank, p, head_dim, m)``. Equals ψ_p(x) Ŵ with Ŵ = Σ_r Θ_{1,r} ⊙ … ⊙ Θ_{p,r}
    (column-wise Kronecker product) without building the ``d^p`` expansion. ``square=True``
    returns φ(x)² elementwise (non-negative features, a kernel of degree 2p).

    ``affine=True`` gives every factor a learned constant, x Θ_{j,r} + c_{j,r} (``bias``:
    ``(rank, p, m)``, initialised to 0, so the map starts as the plain one): the product then
    holds every degree ≤ p, as BASED's 1 + s + s²/2 does, and equals ψ_p([x, 1]) Ŵ with the
    factors [Θ_{j,r}; c_{j,r}] in Ŵ.
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4, rank: int = 1,
                 square: bool = False, temperature: float | None = None, affine: bool = False):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.m = _require_int("m", m)
        self.p = _require_int("p", p)
        self.rank = _require_int("rank", rank)
        self.square = bool(square)
        self.feature_dim = m
        std = sketch_std(head_dim, m, p, rank, temperature)
        self.theta = nn.Parameter(torch.randn(rank, p, head_dim, m) * std)
        self.temperature = temperature
        self.affine = bool(affine)
        self.bias = nn.Parameter(torch.zeros(rank, p, m)) if self.affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = cp_polynomial(x, self.theta, self.bias)
        return out * out if self.square else out

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "LLoPS", "m": self.m, "p": self.p, "rank": self.rank,
                "square": self.square, "affine": self.affine,
                "init": "variance" if self.temperature is None else f"tau={self.temperature:g}"}

    @classmethod
    def from_based(cls, based: Based, p: int = 2, m: int | None = None,
                   spare_std: float = 0.0) -> LLoPS:
        """An affine rank-1 LLoPS map with the same kernel as ``based`` (built for each of a
        layer's query and key maps, the pair reproduces the BASED layer exactly).

        With x̃ = x Wᵀ (W = ``based.projection()``), the columns are: one constant 1 (every
        factor θ = 0, c = 1); r linear terms r^(−1/4)·x̃_i; and r(r+1)/2 quadratic terms
        s_ij·x̃_i·x̃_j for i ≤ j, with s_ii = (2r)^(−1/2) and s_ij = r^(−1/2) (the pair i < j
        stands for both orders), so φ(q)·φ(k) = 1 + s + s²/2 with s = q̃·k̃/√r. Factors a
        term does not use are the constant 1 (θ = 0, c = 1): with p = 4, two of the four
        factors of a quadratic column. ``m`` (default 1 + r + r(r+1)/2, 153 at r = 16) may be
        larger: the spare columns start at θ ~ N(0, spare_std²) and c = 0 in every factor:
        exactly 0 (and, with zero gradient, dead) for ``spare_std = 0``; with a small
        ``spare_std`` they perturb the kernel by O(spare_std^(2p)) and can learn.
        """
        r = based.r
        need = 1 + r + r * (r + 1) // 2
        m = need if m is None else m
        if not isinstance(p, int) or p < 2:
            raise ValueError(f"from_based needs p >= 2 (a quadratic term is a product of two "
                             f"factors), got {p!r}")
        if m < need:
            raise ValueError(f"from_based needs m >= 1 + r + r(r+1)/2 = {need} for r={r}, "
                             f"got m={m}")
        w = based.projection().detach()  # (r, head_dim)
        out = cls(based.head_dim, m=m, p=p, rank=1, affine=True).to(w.device, w.dtype)
        theta = torch.zeros_like(out.theta)  # (1, p, head_dim, m)
        bias = torch.zeros_like(out.bias)  # (1, p, m)
        bias[0, :, :need] = 1.0  # unused factors of every embedded column are the constant 1
        theta[0, 0, :, 1:1 + r] = w.t() * r ** -0.25
        bias[0, 0, 1:1 + r] = 0.0
        col = 1 + r
        for i in range(r):
            for j in range(i, r):
                scale = (2.0 * r) ** -0.5 if i == j else r ** -0.5
                theta[0, 0, :, col] = w[i] * scale
                theta[0, 1, :, col] = w[j]
                bias[0, :2, col] = 0.0
                col += 1
        if m > need:
            theta[0, :, :, need:] = torch.randn_like(theta[0, :, :, need:]) * spare_std
        with torch.no_grad():
            out.theta.copy_(theta)
            out.bias.copy_(bias)
        return out


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
        return power_map(x, self.theta, self.p)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Flatten", "m": self.m, "p": self.p, "rank": 1}


class _TaylorFeatures(torch.autograd.Function):
    """``[1, a·x̃, b·vec(x̃ x̃ᵀ)]`` written straight into one ``(rows, 1 + r + r²)`` buffer
    (no concatenation, no full-width temporaries). ``x̃``: ``(rows, r)``. Under autocast it
    runs in bf16 (each feature is one product of two factors; the backward's sums run over r).

    Backward: ``∂x̃ = a·∂first + b·(∂S + ∂Sᵀ) x̃`` with ``∂S`` the ``(r, r)`` gradient of the
    outer product, read in place from the incoming gradient.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, xt: torch.Tensor, a: float, b: float) -> torch.Tensor:  # type: ignore[override]
        n, r = xt.shape
        out = xt.new_empty(n, 1 + r + r * r)
        out[:, 0].fill_(1.0)
        torch.mul(xt, a, out=out[:, 1:1 + r])
        torch.mul((xt * b).unsqueeze(-1), xt.unsqueeze(-2), out=out[:, 1 + r:].view(n, r, r))
        ctx.save_for_backward(xt)
        ctx.scales = (a, b)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (xt,) = ctx.saved_tensors
        grad = grad.to(xt.dtype)
        a, b = ctx.scales
        n, r = xt.shape
        outer = grad[:, 1 + r:].reshape(n, r, r)
        col = xt.unsqueeze(-1)
        grad_xt = (torch.bmm(outer, col) + torch.bmm(outer.transpose(1, 2), col)).squeeze(-1)
        return grad_xt.mul_(b).add_(grad[:, 1:1 + r], alpha=a), None, None


class Based(FeatureMap):
    """BASED 2nd-order Taylor features of a learned projection x̃ = x W ∈ R^r.

    φ(x) = [1, x̃ / r^{1/4}, vec(x̃ x̃ᵀ) / (√2·√r)], so φ(q)·φ(k) = 1 + s + s²/2 with
    s = q̃·k̃ / √r. ``feature_dim = 1 + r + r²`` (273 for r = 16).

    ``project=False``: x̃ = x itself (no W; ``r`` must equal ``head_dim``), as zoology's Based
    layer does after projecting ``d_model`` straight to r (``model.qk_dim``).
    """

    def __init__(self, head_dim: int, r: int = 16, project: bool = True):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.r = _require_int("r", r)
        if not project and r != head_dim:
            raise ValueError(f"Based(project=False) uses q and k as they come: r must equal "
                             f"their head dimension {head_dim} (model.qk_dim / num_heads), "
                             f"got r={r}")
        self.feature_dim = 1 + r + r * r
        self.proj = nn.Linear(head_dim, r, bias=False) if project else None

    def projection(self) -> torch.Tensor:
        """W as an ``(r, head_dim)`` matrix (the identity when ``project=False``)."""
        if self.proj is None:
            return torch.eye(self.r)
        return self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = x if self.proj is None else self.proj(x)
        a, b = self.r ** -0.25, (2.0 * self.r) ** -0.5
        if not use_cpu_kernels(xt):  # traced ops (GPUs; the compiler can fuse them)
            second = ((xt * b).unsqueeze(-1) * xt.unsqueeze(-2)).flatten(-2)
            return torch.cat([torch.ones_like(xt[..., :1]), xt * a, second], dim=-1)
        flat = _TaylorFeatures.apply(xt.reshape(-1, self.r), a, b)
        return flat.view(*xt.shape[:-1], self.feature_dim)

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


class Identity(FeatureMap):
    """φ(x) = x; ``feature_dim = head_dim``, no parameters (the plain dot-product kernel, e.g.
    for the delta rule as in DeltaNet)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = _require_int("head_dim", head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Identity", "m": self.feature_dim}
