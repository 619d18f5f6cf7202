"""The elementwise half of the blocked CP map in one pass per block, compiled by inductor.

Eagerly, a block's product ``Π_j f_j`` is p − 1 multiplications and its gradient 3p − 4, each
a kernel that reads and writes ``(rows, rank·m)`` tensors; in bf16 each of them also converts
to fp32 and rounds back. Compiled (``torch.compile``, inductor's C++ backend on a CPU), the
forward is one loop over the block (the rank sum included) and the backward another, reading
each factor once.

References: :func:`arbench.kernels.cp._product_into` (forward) and
:func:`arbench.kernels.cp._product_grad_into` (backward). The compiled forms multiply in the
same order, so in fp32 they are bit-identical to them; in bf16 they keep the running products
in fp32 and round once per output, where the eager forms round after every multiplication.

The same for two chains that run fused in bf16 and fp16 only (in fp32 the compiled sums and
products differ from the eager ones by about an ulp, so fp32 keeps the eager kernels): the short
convolution (:func:`conv`, :func:`conv_grad`; reference
:class:`arbench.kernels.conv.CausalDepthwiseConv`'s eager loops) and the attention output's
RMSNorm (:func:`rms_norm`, :func:`rms_norm_grad`; reference ``nn.RMSNorm`` on the input in
fp32, :func:`arbench.kernels.norm.rms_norm_low`), which eagerly is half a dozen passes over
``(batch, heads, seq, head_dim)`` fp32 tensors forward and as many backward, plus the casts
into and out of fp32.

Used for blocks of at least :data:`MIN_ELEMENTS` elements (below that a compile costs more than
it saves), outside dispatch modes, when :func:`fused_kernels` is on (the default) and a C++
compiler works: the first
compile that fails turns the fused path off for the process with one warning, and the eager
forms run.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

MIN_ELEMENTS = 1 << 15
"""The elements (a CP block's ``rows · rank · m``, a convolution's input) from which the compiled
forms run."""

RECOMPILE_LIMIT = 1024
"""Graphs the compiled chains may build in one process, all chains together (dynamo's limits
are raised to it whenever a chain is first compiled)."""

_ENABLED: ContextVar[bool] = ContextVar("fused_kernels", default=True)
_BROKEN: list[str] = []  # the first compile error, once one has failed


@contextlib.contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """Inside the block, run the compiled elementwise forms (``True``, the default) or the
    eager ones (``False``)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def use_fused(elements: int) -> bool:
    """Whether a chain over ``elements`` elements (a CP block's ``rows · rank · m``) runs
    compiled: not under a dispatch mode (a FLOP counter, a tracer), which compiled code would
    bypass."""
    return (_ENABLED.get() and not _BROKEN and elements >= MIN_ELEMENTS
            and _get_current_dispatch_mode() is None)


def product(proj: torch.Tensor, p: int, rank: int) -> torch.Tensor:
    """``Σ_r Π_j`` of the factors of ``proj`` ``(rows, p·rank·m)`` (factor-major) in the
    order of :func:`arbench.kernels.cp._product_into`: ``((f_0 f_1) f_2) …``; returns
    ``(rows, m)``."""
    rows = proj.shape[0]
    factors = proj.view(rows, p, -1)
    out = factors[:, 0] * factors[:, 1]
    for j in range(2, p):
        out = out * factors[:, j]
    return out.view(rows, rank, -1).sum(dim=1) if rank > 1 else out


def product_grad(proj: torch.Tensor, grad_out: torch.Tensor, p: int, rank: int) -> torch.Tensor:
    """``∂/∂f_j = grad_out · Π_{i≠j} f_i`` for every factor of ``proj`` ``(rows, p·rank·m)``,
    in the order of :func:`arbench.kernels.cp._product_grad_into` (prefix products times a
    running suffix product); ``grad_out``: ``(rows, m)``; returns ``(rows, p·rank·m)``."""
    rows = proj.shape[0]
    f = proj.view(rows, p, -1)
    tail = grad_out.repeat(1, rank) if rank > 1 else grad_out  # every rank gets the gradient
    prefix: list[torch.Tensor | None] = [None, None]
    if p > 2:
        prefix.append(f[:, 0] * f[:, 1])
    for j in range(3, p):
        prefix.append(prefix[j - 1] * f[:, j - 1])
    grads: list[torch.Tensor | None] = [None] * p
    for j in range(p - 1, 1, -1):
        grads[j] = prefix[j] * tail
        tail = tail * f[:, j]
    grads[1] = f[:, 0] * tail
    grads[0] = tail * f[:, 1]
    return torch.stack(grads, dim=1).view(rows, -1)  # type: ignore[arg-type]


def _shift(t: torch.Tensor, s: int) -> torch.Tensor:
    """``t`` ``(b, n, d)`` delayed by ``s`` steps along n (zeros for the first s)."""
    return F.pad(t[:, : t.shape[1] - s], (0, 0, s, 0))


def conv(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``y_t = b + Σ_{s<k} w[:, k−1−s] ⊙ h_{t−s}`` (:class:`~arbench.kernels.conv.
    CausalDepthwiseConv`'s forward); ``h``: ``(b, n, d)``, ``w``: ``(d, k)``, ``b``: ``(d,)``."""
    k = w.shape[1]
    out = b + h * w[:, k - 1]
    for s in range(1, min(k, h.shape[1])):
        out = out + _shift(h, s) * w[:, k - 1 - s]
    return out


def conv_grad(grad: torch.Tensor, h: torch.Tensor,
              w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(∂h, ∂w, ∂b)`` of :func:`conv` for ``∂y`` = ``grad`` ``(b, n, d)``; ``∂w`` ``(d, k)``
    and ``∂b`` ``(d,)`` summed over batch and time in fp32."""
    k, n = w.shape[1], h.shape[1]
    grad_h = grad * w[:, k - 1]
    cols: list[torch.Tensor] = [(grad.float() * h.float()).sum((0, 1))]
    for s in range(1, min(k, n)):
        grad_h = grad_h + F.pad(grad[:, s:], (0, 0, 0, s)) * w[:, k - 1 - s]
        cols.append((grad[:, s:].float() * h[:, :-s].float()).sum((0, 1)))
    cols += [torch.zeros_like(cols[0])] * (k - len(cols))  # taps past a sequence this short
    return grad_h, torch.stack(cols[::-1], dim=1), grad.float().sum((0, 1))


def rms_norm(y: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x · r · w`` with ``x = y`` in fp32 and ``r = 1/√(mean(x²) + eps)`` over the last dim
    (:class:`~arbench.kernels.norm.RMSNormLow`'s forward); ``y``: ``(..., d)`` in bf16 or fp16,
    ``w``: ``(d,)``. Returns the output in ``y``'s dtype and ``r`` ``(..., 1)`` in fp32."""
    x = y.float()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (x * r * w).to(y.dtype), r


def rms_norm_grad(grad: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                  r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∂y, ∂w)`` of :func:`rms_norm` for ``∂out`` = ``grad``: with ``x = y``, ``gw = grad · w``
    in fp32, ``∂x = r · gw − x · r³ · mean(gw · x)`` (in ``y``'s dtype) and ``∂w = Σ grad · x · r``
    over every row (fp32)."""
    x, g = y.float(), grad.float()
    gw = g * w
    dx = r * gw - x * (r.pow(3) * (gw * x).mean(-1, keepdim=True))
    return dx.to(y.dtype), (g * x * r).flatten(0, -2).sum(0)


def _raise_limits() -> None:
    """Dynamo's recompile limits at least :data:`RECOMPILE_LIMIT`.

    ``torch.compile`` of a ``functools.partial`` compiles one wrapper frame of dynamo's for
    every chain, so every graph (each chain × its static arguments × dtype × static or dynamic
    shapes) counts towards that one frame's limits: a sweep worker that trains many
    configurations in one process (p ∈ {2, …, 6} × ranks × fp32 and bf16) would pass dynamo's
    defaults (8, and 256 in all) and run the eager kernels from then on."""
    config = torch._dynamo.config
    if config.recompile_limit < RECOMPILE_LIMIT:
        config.recompile_limit = RECOMPILE_LIMIT
    if config.accumulated_recompile_limit < RECOMPILE_LIMIT:
        config.accumulated_recompile_limit = RECOMPILE_LIMIT


@functools.cache
def _compiled(fn: Callable[..., object], **static: float) -> Callable[..., object]:
    """``fn`` with its scalar arguments ``static`` bound, compiled once: a static graph for
    the first shape, one dynamic graph for the rest, per dtype."""
    _raise_limits()
    return torch.compile(functools.partial(fn, **static), fullgraph=True)


def _run(fn: Callable[..., object], *args: torch.Tensor, **static: float) -> object:
    """The compiled ``fn``, or the eager one after the first compile error (warned once)."""
    if not _BROKEN:
        try:
            return _compiled(fn, **static)(*args)
        except Exception as err:  # noqa: BLE001 (inductor raises many kinds; all mean "no")
            _BROKEN.append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
            warnings.warn(f"fused kernels off (compiling failed: {_BROKEN[0]}); the eager "
                          f"kernels run instead", RuntimeWarning, stacklevel=3)
    return fn(*args, **static)


def fused_product(proj: torch.Tensor, p: int, rank: int) -> torch.Tensor:
    """:func:`product`, compiled."""
    return _run(product, proj, p=p, rank=rank)  # type: ignore[return-value]


def fused_product_grad(proj: torch.Tensor, grad_out: torch.Tensor, p: int,
                       rank: int) -> torch.Tensor:
    """:func:`product_grad`, compiled."""
    return _run(product_grad, proj, grad_out, p=p, rank=rank)  # type: ignore[return-value]


def fused_conv(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`conv`, compiled."""
    return _run(conv, h, w, b)  # type: ignore[return-value]


def fused_conv_grad(grad: torch.Tensor, h: torch.Tensor,
                    w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`conv_grad`, compiled."""
    return _run(conv_grad, grad, h, w)  # type: ignore[return-value]


def fused_rms_norm(y: torch.Tensor, w: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm`, compiled."""
    return _run(rms_norm, y, w, eps=eps)  # type: ignore[return-value]


def fused_rms_norm_grad(grad: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                        r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm_grad`, compiled."""
    return _run(rms_norm_grad, grad, y, w, r)  # type: ignore[return-value]


__all__ = ["MIN_ELEMENTS", "RECOMPILE_LIMIT", "conv", "conv_grad", "fused_conv",
           "fused_conv_grad", "fused_kernels", "fused_product", "fused_product_grad", "fused_rms_norm",
           "fused_rms_norm_grad", "product", "product_grad", "rms_norm", "rms_norm_grad",
           "use_fused"]
