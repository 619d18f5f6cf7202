"""Sequence mixers: ``(batch, seq, d_model) -> (batch, seq, d_model)``, causal.

Each mixer also reports ``state_size(seq_len)``: floats of recurrent state it carries per layer
when generating (m·dv·heads for linear attention; the KV cache for softmax; the conv window).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from arbench.attention import MODES, linear_attention, normalize_option, softmax_attention
from arbench.featuremaps import FeatureMap
from arbench.precision import CPU_AUTOCAST_DTYPE, accumulator_dtype, use_cpu_kernels

FeatureMapFactory = Callable[[int], FeatureMap]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(b, n, h·dh) -> (b, h, n, dh)``."""
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, dh) -> (b, n, h·dh)``."""
    return x.transpose(1, 2).flatten(-2)


def check_heads(d_model: int, num_heads: int) -> int:
    """Return ``head_dim``; raise ``ValueError`` unless ``num_heads`` divides ``d_model``."""
    if num_heads < 1 or d_model < 1 or d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a positive multiple of num_heads={num_heads}")
    return d_model // num_heads


class LinearAttention(nn.Module):
    """Multi-head causal linear attention with separate query and key feature maps.

    ``feature_map(head_dim)`` is called twice (φ_Q, φ_K). ``output_norm`` applies a per-head
    RMSNorm to the attention output; by default it is on exactly when there is no denominator.

    The default is no denominator plus the output RMSNorm: with signed features (LLoPS) the
    denominator Σ f·g can cross zero, and in calibration runs a p=4 model with the sign-safe
    denominator stayed near chance long after the output-norm variant learned the task;
    ``sweeps/normalize.yaml`` compares the choices.
    """

    def __init__(self, d_model: int, num_heads: int, feature_map: FeatureMapFactory,
                 normalize: bool | str = False, output_norm: bool | None = None,
                 chunk_size: int = 64, mode: str = "chunked", eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(d_model, num_heads)
        if mode not in MODES:
            raise ValueError(f"attention mode must be one of {MODES}, got {mode!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.normalize = normalize_option(normalize)
        self.mode, self.chunk_size, self.eps = mode, chunk_size, eps
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.phi_q = feature_map(self.head_dim)
        self.phi_k = feature_map(self.head_dim)
        if not isinstance(self.phi_q, nn.Module) or not hasattr(self.phi_q, "feature_dim"):
            raise ValueError("feature_map must build an nn.Module with a feature_dim attribute")
        use_norm = self.normalize == "none" if output_norm is None else output_norm
        self.norm = nn.RMSNorm(self.head_dim) if use_norm else nn.Identity()

    @property
    def feature_dim(self) -> int:
        return self.phi_q.feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        y = linear_attention(self.phi_q(q), self.phi_k(k), v, mode=self.mode,
                             chunk_size=self.chunk_size, normalize=self.normalize, eps=self.eps)
        if isinstance(self.norm, nn.RMSNorm):  # in its weight's dtype: fp32 under autocast
            y = self.norm(y.to(self.norm.weight.dtype))
        return self.out(merge_heads(y))

    def state_size(self, seq_len: int) -> int:
        return self.feature_dim * self.head_dim * self.num_heads

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {**self.phi_q.hparams(), "normalize": self.normalize}


class SoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention (``scaled_dot_product_attention``)."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(d_model, num_heads)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, each ``(b, h, n, head_dim)``."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return split_heads(q, self.num_heads), split_heads(k, self.num_heads), \
            split_heads(v, self.num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(merge_heads(softmax_attention(*self.qkv_heads(x))))

    def state_size(self, seq_len: int) -> int:
        return 2 * seq_len * self.head_dim * self.num_heads  # the KV cache

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "softmax"}


class _CausalDepthwiseConv(torch.autograd.Function):
    """``y_t = b + Σ_{s<k} w[:, k−1−s] ⊙ h_{t−s}`` on ``(batch, seq, d)`` in place of a
    transposed ``Conv1d``: k fused multiply-adds over shifted slices, and a backward of the
    same shape (``∂h``: shifted multiply-adds; ``∂w``, ``∂b``: sums over batch and time).
    ``w``: ``(d, k)``; ``b``: ``(d,)``. Under autocast all three are cast to bf16 (each output
    is a sum of k terms); ``∂w`` and ``∂b``, sums over batch·time, are taken in fp32.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, h: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                b: torch.Tensor) -> torch.Tensor:
        k = w.shape[1]
        out = torch.addcmul(b, h, w[:, k - 1])
        for s in range(1, min(k, h.shape[1])):
            out[:, s:].addcmul_(h[:, :-s], w[:, k - 1 - s])
        ctx.save_for_backward(h, w)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        h, w = ctx.saved_tensors
        k, acc = w.shape[1], accumulator_dtype(h)
        grad = grad.to(h.dtype).contiguous()
        grad_h = grad * w[:, k - 1]
        grad_w = torch.zeros_like(w, dtype=acc)
        grad_w[:, k - 1] = (grad * h).sum((0, 1), dtype=acc)
        for s in range(1, min(k, h.shape[1])):
            grad_h[:, :-s].addcmul_(grad[:, s:], w[:, k - 1 - s])
            grad_w[:, k - 1 - s] = (grad[:, s:] * h[:, :-s]).sum((0, 1), dtype=acc)
        return grad_h, grad_w, grad.sum((0, 1), dtype=acc)


class ShortConv(nn.Module):
    """Gated short convolution: ``out(conv(in(x)) * gate(x))``, causal depthwise, kernel 3."""

    def __init__(self, d_model: int, kernel_size: int = 3):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size = kernel_size
        self.d_model = d_model
        self.inp = nn.Linear(d_model, d_model)
        self.gate = nn.Linear(d_model, d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model,
                              padding=kernel_size - 1)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if not use_cpu_kernels(h):  # the traced convolution (GPUs, torch.compile)
            u = self.conv(h.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
        else:  # the same convolution without transposes (half the time of Conv1d fwd+bwd)
            u = _CausalDepthwiseConv.apply(h, self.conv.weight[:, 0, :], self.conv.bias)
        return self.out(u * self.gate(x))

    def state_size(self, seq_len: int) -> int:
        return self.kernel_size * self.d_model


def mlp(d_model: int, expand: int = 4) -> nn.Module:
    """A GELU MLP ``d_model -> expand·d_model -> d_model``."""
    return nn.Sequential(nn.Linear(d_model, expand * d_model), nn.GELU(),
                         nn.Linear(expand * d_model, d_model))


__all__ = ["FeatureMapFactory", "LinearAttention", "ShortConv", "SoftmaxAttention", "mlp"]
