"""Where the CPU kernels run, in which dtype, and whether this machine has native bf16.

Dtype rules shared by every custom autograd Function (feature maps, chunked attention, short
convolution):

- Under autocast (e.g. ``--trainer.precision bf16-mixed``) a Function's floating inputs are cast
  to bf16 and it runs with autocast off (``torch.amp.custom_fwd(cast_inputs=torch.bfloat16)``):
  its matmuls take bf16 operands and accumulate in fp32 inside the BLAS, as autocast's own
  ``mm`` does. Outside autocast a Function computes in the dtype of its inputs.
- Sums that run long are kept in :func:`accumulator_dtype` (fp32, or float64 for float64
  inputs): the chunked attention's state and denominator, the weight gradients summed over
  batch·seq rows. The loss and log-softmax are computed in fp32 by the caller.

On a CPU, bf16 matmuls are fast only where oneDNN has native bf16 instructions (avx512_bf16 or
AMX); elsewhere they are emulated and run far slower than fp32 (:func:`native_bf16`,
``python -m arbench.bench`` measures both peaks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

_CPU_KERNELS: ContextVar[bool] = ContextVar("cpu_kernels", default=True)


def _fast_paths_on() -> bool:
    """Not being traced by ``torch.compile`` and kernels not switched off by :func:`cpu_kernels`."""
    return not torch.compiler.is_compiling() and _CPU_KERNELS.get()


def use_cpu_kernels(x: torch.Tensor) -> bool:
    """The one rule for where the CPU kernels (:mod:`arbench.kernels`) run: a CPU tensor, not
    being traced by ``torch.compile``, kernels not switched off by :func:`cpu_kernels`.
    Elsewhere (GPUs, compiled graphs) the plain reference forms run, or on a GPU the CUDA
    paths of :func:`use_cuda_kernels`."""
    return x.device.type == "cpu" and _fast_paths_on()


def use_cuda_kernels(x: torch.Tensor) -> bool:
    """The same rule on a GPU: a CUDA tensor, not being traced by ``torch.compile``, kernels not
    switched off by :func:`cpu_kernels`. Where it holds, the CUDA paths may run: fla's Triton
    kernels for the attention forms (:mod:`arbench.kernels.fla_backend`, which adds its own
    dtype and width conditions) and the compiled CP product
    (:mod:`arbench.kernels.compiled`)."""
    return x.device.type == "cuda" and _fast_paths_on()


@contextlib.contextmanager
def cpu_kernels(enabled: bool) -> Iterator[None]:
    """Inside the block, run the CPU kernels and the CUDA paths (``True``, the default) or the
    plain reference forms everywhere (``False``)."""
    token = _CPU_KERNELS.set(bool(enabled))
    try:
        yield
    finally:
        _CPU_KERNELS.reset(token)


CPU_AUTOCAST_DTYPE = torch.bfloat16
"""The dtype the CPU Functions cast to under autocast (``cast_inputs`` of their forward)."""
LOW_PRECISION = (torch.bfloat16, torch.float16)
"""The half-width float dtypes, whose kernels may take other block sizes and fused paths."""


def kernel_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype a kernel computes in: the promoted dtype of ``tensors``, except under
    autocast on their device, where float32 and lower become autocast's dtype (for CPU
    tensors :data:`CPU_AUTOCAST_DTYPE`, what the kernels' ``custom_fwd`` casts to). float64
    stays float64 under autocast too, as autocast and ``custom_fwd`` leave it."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if dtype == torch.float64:
        return dtype
    if tensors[0].device.type == "cuda":
        if torch.is_autocast_enabled("cuda"):
            return torch.get_autocast_dtype("cuda")
    elif torch.is_autocast_enabled("cpu"):
        return CPU_AUTOCAST_DTYPE
    return dtype


def accumulator_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and lower-precision inputs, float64 when any input is float64."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """True when bf16 matmuls have native hardware support on ``device``.

    CPU: oneDNN reports bf16 support (avx512_bf16 / AMX; a hypervisor may hide the flags).
    CUDA: ``torch.cuda.is_bf16_supported()``.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def bf16_warning(precision: str | int | None, device: str) -> str | None:
    """A one-line warning when ``precision`` asks for bf16 on a CPU without native bf16."""
    if precision is None or "bf16" not in str(precision) or device != "cpu" or native_bf16("cpu"):
        return None
    return (f"precision {precision} on a CPU without native bf16 (no avx512_bf16/AMX reported "
            "by oneDNN): bf16 matmuls are emulated and much slower than fp32 here "
            "(python -m arbench.bench measures both)")


__all__ = ["CPU_AUTOCAST_DTYPE", "accumulator_dtype", "bf16_warning", "cpu_kernels",
           "kernel_dtype", "native_bf16", "use_cpu_kernels", "use_cuda_kernels"]
