"""flash-linear-attention (fla, ``pip install fla-core``, see ``requirements-gpu.txt``) as the
CUDA backend of arbench's chunked attention forms: additive and gated linear attention
(``chunk_simple_gla``, a scalar gate per head and token), the delta rule (``chunk_delta_rule``)
and the gated delta rule (``chunk_gated_delta_rule``), over any feature map's features.

Which calls go to fla (:func:`fla_dtype`): the chunked form of :func:`arbench.attention.
linear_attention` or :func:`arbench.delta.delta_attention` where
:func:`arbench.precision.use_cuda_kernels` holds (a CUDA tensor, not compiling, kernels not
switched off), fla imports, the compute dtype (:func:`arbench.precision.kernel_dtype`:
autocast's dtype under CUDA autocast, else the inputs') is in :data:`FLA_DTYPES`, and for the
delta rules the feature width is at most :data:`DELTA_MAX_WIDTH`. Every other call runs
arbench's own form, as before: fp32 and float64 compute in arbench's fp32 (float64) form
(``chunk_delta_rule`` refuses float32, and fla's float32 dots run in tf32, so one rule for all
four forms keeps fp32 meaning full fp32).

The mapping of arbench's conventions onto fla's, written once here (each tested in
``tests/kernels/test_fla_backend.py`` against a plain-torch model of fla's documented
recurrence):

- layout: arbench's ``(batch, heads, seq, d)`` and per-token scalars ``(batch, heads, seq)``
  are fla's ``(batch, seq, heads, d)`` / ``(batch, seq, heads)`` (:func:`to_fla`,
  :func:`from_fla`);
- scale: arbench has none (``y_t = S_tᵀ f_t``): ``scale=1.0`` (fla's default is ``K^-1/2``);
- gate: arbench's ``log_decay`` ≤ 0 is a natural log, ``α_t = exp(log_decay_t)`` scales the
  state before token t is added; fla's log-space ``g`` is the same numbers with the same order
  (its kernels rescale to base 2 inside); passed in float32;
- β: the same numbers, laid out as fla's, in the compute dtype;
- q/k normalisation: arbench uses f and g as given (the mixers L2-normalise them before the
  delta rule): ``use_qk_l2norm_in_kernel=False``;
- state: arbench starts from zero and returns no final state: ``initial_state=None``,
  ``output_final_state=False``;
- denominator: ``linear_attention`` appends a ones column to v and divides by
  :func:`~arbench.attention.safe_denominator` of the last output column in fp32, as for its own
  forms; fla runs unnormalised (``chunk_simple_gla``; ``chunk_linear_attn(normalize=True)``
  divides by ``q·Σk·scale + 1e-10``, another rule);
- widths: fla's 16-bit kernels need even K and V (its backward asserts it): an odd width gets
  one zero column (:func:`pad_even`), dropped from the output;
- ``chunk_size``: not used; fla's chunk is :data:`FLA_CHUNK`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from arbench.precision import kernel_dtype, use_cuda_kernels

FLA_CHUNK = 64
"""The chunk length fla's chunked kernels use, whatever arbench's chunk size (FLOP counts of
the rows it computes, :mod:`arbench.bench.layers`)."""

FORMS = ("linear", "gated", "delta", "gated_delta")
FLA_DTYPES = (torch.bfloat16, torch.float16)
"""Compute dtypes that go to fla; every other dtype runs arbench's own form."""
DELTA_MAX_WIDTH = 256
"""fla's delta-rule kernels assert ``K <= 256``; wider features run arbench's delta form."""


@dataclass(frozen=True)
class FlaOps:
    """The three fla entry points this backend calls (fla's signatures), and fla's version."""

    simple_gla: Callable
    delta_rule: Callable
    gated_delta_rule: Callable
    version: str


@functools.cache
def _load() -> tuple[FlaOps | None, str]:
    """Import fla once: ``(ops, "")``, or ``(None, why not)``."""
    try:
        import fla
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as err:  # ImportError, or triton failing at import on a driverless machine
        return None, f"fla not importable ({type(err).__name__}: {err})".splitlines()[0]
    return FlaOps(chunk_simple_gla, chunk_delta_rule, chunk_gated_delta_rule,
                  str(getattr(fla, "__version__", "unknown"))), ""


def fla_ops() -> FlaOps | None:
    """fla's entry points, or None when fla does not import here (imported on first use)."""
    return _load()[0]


def unavailable_reason() -> str:
    """Why fla cannot be used here (``""`` when it imports)."""
    return _load()[1]


def skip_reason(form: str, dtype: torch.dtype, width: int) -> str:
    """Why a CUDA call of ``form`` (one of :data:`FORMS`) computing in ``dtype`` on ``width``
    features runs arbench's own form instead of fla; ``""`` when fla runs it."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if dtype not in FLA_DTYPES:
        return f"{dtype} computes in arbench's form (fla takes {', '.join(map(str, FLA_DTYPES))})"
    if form in ("delta", "gated_delta") and width > DELTA_MAX_WIDTH:
        return f"{width} features > {DELTA_MAX_WIDTH}, the widest fla's delta-rule kernels take"
    return unavailable_reason()


def fla_dtype(form: str, f: torch.Tensor, *tensors: torch.Tensor) -> torch.dtype | None:
    """The dtype fla computes ``form`` in for features ``f`` ``(b, h, n, m)`` and the other
    inputs ``tensors``, or None where arbench's own form runs (module docstring)."""
    if not use_cuda_kernels(f):
        return None
    dtype = kernel_dtype(f, *tensors)
    return None if skip_reason(form, dtype, f.shape[-1]) else dtype


def to_fla(t: torch.Tensor) -> torch.Tensor:
    """arbench's ``(b, h, n, d)`` → fla's ``(b, n, h, d)``; per-token scalars ``(b, h, n)`` →
    ``(b, n, h)``. Contiguous (fla's kernels take strided inputs only after a copy)."""
    return t.transpose(1, 2).contiguous()


def from_fla(t: torch.Tensor) -> torch.Tensor:
    """fla's ``(b, n, h, d)`` → arbench's ``(b, h, n, d)`` (a view)."""
    return t.transpose(1, 2)


def pad_even(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``(..., d)`` with one zero column appended when ``d`` is odd: zero features add
    nothing to the scores or the state, a zero value column gives a zero output column."""
    return F.pad(t, (0, 1)) if t.shape[-1] % 2 else t


def fla_linear(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor,
               log_decay: torch.Tensor | None = None, ops: FlaOps | None = None) -> torch.Tensor:
    """Causal linear attention ``y_t = S_tᵀ f_t``, ``S_t = α_t S_{t−1} + g_t v_tᵀ`` (α = 1
    without ``log_decay``), unnormalised, through ``chunk_simple_gla``.

    ``f, g``: ``(b, h, n, m)``; ``v``: ``(b, h, n, dv)``, all in one dtype of
    :data:`FLA_DTYPES`; ``log_decay``: ``(b, h, n)``. Returns ``(b, h, n, dv)`` in that dtype.
    ``ops``: fla's entry points (default: fla's own; tests pass a model of them).
    """
    ops = ops or fla_ops()
    gate = None if log_decay is None else to_fla(log_decay.float())
    out, _ = ops.simple_gla(to_fla(pad_even(f)), to_fla(pad_even(g)), to_fla(pad_even(v)),
                            g=gate, scale=1.0, initial_state=None, output_final_state=False)
    return from_fla(out)[..., :v.shape[-1]]


def fla_delta(f: torch.Tensor, g: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
              log_decay: torch.Tensor | None = None, ops: FlaOps | None = None) -> torch.Tensor:
    """The (gated) delta rule ``S_t = α_t (I − β_t g_t g_tᵀ) S_{t−1} + β_t g_t v_tᵀ``,
    ``y_t = S_tᵀ f_t``, through ``chunk_delta_rule`` (``chunk_gated_delta_rule`` with
    ``log_decay``), f and g as given.

    ``f, g``: ``(b, h, n, m)``, m ≤ :data:`DELTA_MAX_WIDTH`; ``v``: ``(b, h, n, dv)``;
    ``beta``: ``(b, h, n)``, all in one dtype of :data:`FLA_DTYPES`; ``log_decay``:
    ``(b, h, n)``. Returns ``(b, h, n, dv)`` in that dtype.
    """
    ops = ops or fla_ops()
    q, k, val = to_fla(pad_even(f)), to_fla(pad_even(g)), to_fla(pad_even(v))
    common = {"beta": to_fla(beta), "scale": 1.0, "initial_state": None,
              "output_final_state": False, "use_qk_l2norm_in_kernel": False}
    if log_decay is None:
        out, _ = ops.delta_rule(q, k, val, **common)
    else:
        out, _ = ops.gated_delta_rule(q, k, val, g=to_fla(log_decay.float()), **common)
    return from_fla(out)[..., :v.shape[-1]]


def backend_name(form: str, device: str | torch.device, dtype: torch.dtype, width: int) -> str:
    """``"fla <version>"`` or ``"arbench"``: who computes ``form`` for a chunked call on
    ``device`` in ``dtype`` with ``width`` features, kernels on (for reports)."""
    if torch.device(device).type != "cuda" or skip_reason(form, dtype, width):
        return "arbench"
    return f"fla {fla_ops().version}"


__all__ = ["DELTA_MAX_WIDTH", "FLA_DTYPES", "FORMS", "FlaOps", "backend_name", "fla_delta",
           "fla_dtype", "fla_linear", "fla_ops", "from_fla", "pad_even", "skip_reason",
           "to_fla", "unavailable_reason"]
