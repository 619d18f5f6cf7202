"""The causal depthwise convolution of the short-convolution mixer without transposes.

Reference: :func:`arbench.naive.naive_causal_conv` (a depthwise ``conv1d`` padded k − 1 on both
sides over the transposed sequence, its first n outputs), value and gradient.
"""

from __future__ import annotations

import torch

from arbench.kernels.fused import fused_conv, fused_conv_grad, use_fused
from arbench.precision import CPU_AUTOCAST_DTYPE, LOW_PRECISION, accumulator_dtype


def _fused(h: torch.Tensor) -> bool:
    """Whether the convolution of ``h`` runs fused: a low-precision input large enough."""
    return h.dtype in LOW_PRECISION and use_fused(h.numel())


class CausalDepthwiseConv(torch.autograd.Function):
    """``y_t = b + Σ_{s<k} w[:, k−1−s] ⊙ h_{t−s}`` on ``(batch, seq, d)``: k fused
    multiply-adds over shifted slices, and a backward of the same shape (``∂h``: shifted
    multiply-adds; ``∂w``, ``∂b``: sums over batch and time). ``w``: ``(d, k)``; ``b``:
    ``(d,)``. Under autocast all three are cast to bf16 (each output is a sum of k terms);
    ``∂w`` and ``∂b``, sums over batch·time, are taken in fp32. In bf16 and fp16 the forward
    and backward run fused (:func:`~arbench.kernels.fused.fused_conv`, one pass each, fp32
    arithmetic, one rounding per output).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, h: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, w)
        if _fused(h):
            return fused_conv(h, w, b)
        k = w.shape[1]
        out = torch.addcmul(b, h, w[:, k - 1])
        for s in range(1, min(k, h.shape[1])):
            out[:, s:].addcmul_(h[:, :-s], w[:, k - 1 - s])
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        h, w = ctx.saved_tensors
        k, acc = w.shape[1], accumulator_dtype(h)
        grad = grad.to(h.dtype).contiguous()
        if _fused(h):
            return fused_conv_grad(grad, h, w)
        grad_h = grad * w[:, k - 1]
        grad_w = torch.zeros_like(w, dtype=acc)
        grad_w[:, k - 1] = (grad * h).sum((0, 1), dtype=acc)
        for s in range(1, min(k, h.shape[1])):
            grad_h[:, :-s].addcmul_(grad[:, s:], w[:, k - 1 - s])
            grad_w[:, k - 1 - s] = (grad[:, s:] * h[:, :-s]).sum((0, 1), dtype=acc)
        return grad_h, grad_w, grad.sum((0, 1), dtype=acc)


def causal_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``h``: ``(batch, seq, d)``; ``weight``: ``(d, 1, k)`` (``nn.Conv1d``'s depthwise
    layout); ``bias``: ``(d,)``; returns ``(batch, seq, d)``."""
    return CausalDepthwiseConv.apply(h, weight[:, 0, :], bias)


__all__ = ["CausalDepthwiseConv", "causal_conv"]
