"""Blocked CPU kernels of the polynomial feature maps: ``Σ_r Π_j (x W + b)`` and ``(x W)^p``.

References (what each must equal, value and gradient):

- :func:`cp_product` equals :func:`arbench.naive.naive_cp_product` (the plain sum of products);
- :func:`projected_power` equals :func:`arbench.naive.naive_projected_power` (``(x @ w)^p`` by
  the same left-to-right powering).

The rows of ``x`` go through in blocks (:func:`cp_block_rows`; 512 rows by default in fp32, 4096
in bf16): a block's
projections ``(rows, k)`` are multiplied out while they are still in cache, and the backward is
hand-written (:class:`BlockedMap`): the products' gradients without a stack of p tensors, ``∂x``
written per block, ``∂w`` summed over blocks in :func:`~arbench.precision.accumulator_dtype`
(under autocast then rounded to the bf16 weights' dtype, see :class:`BlockedMap`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from arbench.checks import check_int
from arbench.kernels.fused import fused_product, fused_product_grad, use_fused
from arbench.precision import (
    CPU_AUTOCAST_DTYPE,
    LOW_PRECISION,
    accumulator_dtype,
    kernel_dtype,
)

DEFAULT_BLOCK_ROWS = 512
"""Rows per block in fp32 and float64."""
DEFAULT_LOW_PRECISION_BLOCK_ROWS = 4096
"""Rows per block in bf16 and fp16, where the matmuls of few rows lose most (AMX's bf16
matmuls of 512-row blocks ran far below their rate; results/README.md, ``bench/bf16_amx/``)."""
_BLOCK_ROWS: ContextVar[tuple[int, int] | None] = ContextVar("cp_block_rows", default=None)


@contextlib.contextmanager
def cp_block_rows(rows: int, low_precision: int | None = None) -> Iterator[None]:
    """Run the blocked maps with blocks of ``rows`` rows (0: one block) inside the block; in
    bf16 and fp16 with ``low_precision`` rows (None: ``rows`` too). ``python -m arbench.bench``
    tunes ``rows`` (``--cp-block-rows``)."""
    check_int("cp block rows", rows, minimum=0)
    low = rows if low_precision is None else low_precision
    check_int("cp block rows (low precision)", low, minimum=0)
    token = _BLOCK_ROWS.set((rows, low))
    try:
        yield
    finally:
        _BLOCK_ROWS.reset(token)


def block_rows(dtype: torch.dtype = torch.float32) -> int:
    """The rows per block in effect here for inputs of ``dtype`` (:func:`cp_block_rows`, else
    :data:`DEFAULT_BLOCK_ROWS` or :data:`DEFAULT_LOW_PRECISION_BLOCK_ROWS`; 0: one block)."""
    low = dtype in LOW_PRECISION
    chosen = _BLOCK_ROWS.get()
    if chosen is None:
        return DEFAULT_LOW_PRECISION_BLOCK_ROWS if low else DEFAULT_BLOCK_ROWS
    return chosen[1] if low else chosen[0]


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
    (p = 4: two squarings; p = 6: y², y³, y⁶), no scratch and no copy for p ≥ 2; the same
    products in the same order as :func:`arbench.naive.int_power`. (``Tensor.pow`` has
    fast kernels for p ≤ 3 only: results/kernels.md.)"""
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


class CPKind:
    """Σ_r Π_j of the projections: ``(rows, p·rank·m)`` factor-major → ``(rows, m)``."""

    def __init__(self, p: int, rank: int, m: int):
        self.p, self.rank, self.m = p, rank, m
        self.width = rank * m  # columns of one factor j (all ranks)

    def scratch(self, x: torch.Tensor, rows: int) -> list[torch.Tensor]:
        return [x.new_empty(rows, self.width)] if self.rank > 1 else []

    def forward_into(self, out: torch.Tensor, proj: torch.Tensor, scratch: list) -> None:
        rows = proj.shape[0]
        if use_fused(rows * self.width):
            out.copy_(fused_product(proj, self.p, self.rank))
            return
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
        if use_fused(rows * self.width):
            return fused_product_grad(proj, grad_out, self.p, self.rank)
        if self.rank > 1:  # the rank sum passes the same gradient to every rank
            grad_out = grad_out.unsqueeze(1).expand(rows, self.rank, self.m).reshape(rows, -1)
        grad = scratch[0][:rows].view(rows, self.p, self.width)
        _product_grad_into(grad, proj.view(rows, self.p, self.width), grad_out,
                           scratch[1][:rows])
        return grad.view(rows, self.p * self.width)


class PowerKind:
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


Kind = CPKind | PowerKind


def _blocked_forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, kind: Kind,
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


class BlockedMap(torch.autograd.Function):
    """A feature map ``kind(x @ w + bias)`` on ``(rows, d)`` inputs, blocked forward and
    backward.

    Saves the input, the weights and the projections (as autograd would) and computes, block by
    block, the projections' gradient (``kind.grad_into``), then ``∂x`` (a matmul into the
    block's rows) and ``∂w`` (summed over blocks in an fp32 accumulator). Under autocast the
    weights enter already cast to bf16 (:func:`blocked_map`), so autograd rounds that fp32 ``∂w``
    to bf16 on its way back through the cast, as it rounds the weight gradient of autocast's own
    matmuls: the accumulation over blocks is exact to fp32, the parameter's gradient bf16.

    Autocast: inputs are cast to bf16 and the whole map runs in bf16 (projections and the product
    over p). On random inputs (tests/test_precision.py) the product of p bf16 factors is within
    a few bf16 roundings of the fp32 map: an fp32 product of the same bf16 projections is no
    closer, because the projections' own rounding dominates.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, kind: Kind, m: int, block: int) -> torch.Tensor:
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


def blocked_map(x: torch.Tensor, w: torch.Tensor, kind: Kind, m: int,
                bias: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
    """``kind(x @ w + bias)`` for ``x``: ``(..., d)``, ``w``: ``(d, k)``, ``bias``: ``(k,)`` or
    None, in blocks of ``rows`` rows (None: :func:`block_rows`; 0: one block), with
    :class:`BlockedMap` when a gradient is needed; returns ``(..., m)``."""
    d = w.shape[0]
    dtype = kernel_dtype(x)  # bf16 under autocast, as the Function's custom_fwd casts
    x2 = x.reshape(-1, d).to(dtype).contiguous()
    w = w.to(dtype).contiguous()
    bias = None if bias is None else bias.to(dtype).contiguous()
    block = (block_rows(dtype) if rows is None else rows) or max(x2.shape[0], 1)
    if torch.is_grad_enabled() and (x2.requires_grad or w.requires_grad or (
            bias is not None and bias.requires_grad)):
        out = BlockedMap.apply(x2, w, bias, kind, m, block)
    else:
        out = _blocked_forward(x2, w, bias, kind, m, block, None)
    return out.view(*x.shape[:-1], m)


def cp_product(x: torch.Tensor, w: torch.Tensor, p: int, rank: int,
               bias: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
    """``Σ_r Π_j (x W_{j,r} + b_{j,r})`` blocked; ``w``: ``(d, p·rank·m)`` factor-major,
    ``bias``: ``(p·rank·m,)`` or None; ``x``: ``(..., d)`` → ``(..., m)``; needs p ≥ 2.
    Reference: :func:`arbench.naive.naive_cp_product`."""
    m = w.shape[1] // (p * rank)
    return blocked_map(x, w, CPKind(p, rank, m), m, bias, rows)


def projected_power(x: torch.Tensor, w: torch.Tensor, p: int,
                    rows: int | None = None) -> torch.Tensor:
    """``(x @ w) ** p`` blocked, the power by squarings and its gradient ``p·y^(p−1)·∂out``;
    ``x``: ``(..., d)``, ``w``: ``(d, m)`` → ``(..., m)``.
    Reference: :func:`arbench.naive.naive_projected_power`."""
    return blocked_map(x, w, PowerKind(p, w.shape[1]), w.shape[1], rows=rows)


__all__ = ["DEFAULT_BLOCK_ROWS", "DEFAULT_LOW_PRECISION_BLOCK_ROWS", "BlockedMap", "block_rows",
           "blocked_map", "cp_block_rows",
           "cp_product", "projected_power"]
