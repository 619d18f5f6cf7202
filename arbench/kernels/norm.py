"""The attention output's RMSNorm in bf16 and fp16: one compiled pass forward and one backward.

Reference: ``nn.RMSNorm`` applied to the input cast to fp32 (what
:class:`arbench.mixers.FeatureMapAttention` runs eagerly, and everywhere this kernel does not),
value and gradient. The kernel computes in fp32 as the reference does and returns the output in
the input's dtype, the dtype the output projection reads under autocast anyway, so the casts
into and out of fp32 (and their gradients) are folded into the two passes.
"""

from __future__ import annotations

import torch
from torch import nn

from arbench.kernels.fused import fused_rms_norm, fused_rms_norm_grad, use_fused
from arbench.precision import LOW_PRECISION, use_cpu_kernels


class RMSNormLow(torch.autograd.Function):
    """``y · r · w`` with ``r = 1/√(mean(y²) + eps)`` over the last dim, ``y`` ``(..., d)`` in
    bf16 or fp16 (arithmetic in fp32, one rounding per output), ``w`` ``(d,)`` fp32; ``∂w`` is
    summed over every row in fp32 (:func:`~arbench.kernels.fused.rms_norm_grad`)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                eps: float) -> torch.Tensor:
        out, r = fused_rms_norm(y, w, eps)
        ctx.save_for_backward(y, w, r)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        y, w, r = ctx.saved_tensors
        grad_y, grad_w = fused_rms_norm_grad(grad.contiguous(), y, w, r)
        return grad_y, grad_w.to(w.dtype), None


def runs_low(y: torch.Tensor, norm: nn.RMSNorm) -> bool:
    """Whether :func:`rms_norm_low` runs for ``y``: a bf16 or fp16 input on which the CPU
    kernels run, fp32 weights, the fused kernels on and ``y`` large enough
    (:func:`arbench.kernels.fused.use_fused`)."""
    return (y.dtype in LOW_PRECISION and norm.weight is not None
            and norm.weight.dtype == torch.float32 and len(norm.normalized_shape) == 1
            and use_cpu_kernels(y) and use_fused(y.numel()))


def rms_norm_low(y: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    """``norm`` (an ``nn.RMSNorm`` over the last dim, fp32 weight) applied to ``y`` in fp32,
    returned in ``y``'s dtype, as one compiled pass (:class:`RMSNormLow`). ``eps``: the
    norm's, or fp32's machine epsilon when it has none (``nn.RMSNorm``'s rule for an fp32
    input)."""
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
    return RMSNormLow.apply(y, norm.weight, float(eps))


__all__ = ["RMSNormLow", "rms_norm_low", "runs_low"]
