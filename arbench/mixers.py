"""Sequence mixers: ``(batch, seq, d_model) -> (batch, seq, d_model)``, causal.

Each mixer also reports ``state_size(seq_len)``: floats of recurrent state it carries per layer
when generating (m·dv·heads for linear, gated and delta-rule attention; the KV cache for softmax;
the conv window).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from arbench import kernels
from arbench.attention import MODES, linear_attention, normalize_option, softmax_attention
from arbench.delta import DELTA_MODES, delta_attention, l2_normalize
from arbench.featuremaps import FeatureMap
from arbench.kernels.norm import rms_norm_low, runs_low
from arbench.naive import naive_causal_conv
from arbench.precision import use_cpu_kernels

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


class FeatureMapAttention(nn.Module):
    """The plumbing every feature-map mixer shares: a fused q/k/v projection, φ_Q and φ_K
    (``feature_map(qk_head_dim)`` called twice), a per-head RMSNorm on the attention output when
    ``use_norm`` (computed in fp32; for a bf16 or fp16 attention output on a CPU as one compiled
    pass, :func:`arbench.kernels.norm.rms_norm_low`), and the output projection. Subclasses
    define :meth:`mix`, the causal state update from features ``f, g`` and values ``v`` to
    ``(batch, heads, seq, head_dim)``.
    ``qk_norm``: q and k go through a LayerNorm without affine parameters (zero mean, unit
    variance per head vector) before φ, as PolySketchFormer and fla's learnable PolySketch do.
    ``qk_dim``: the width of q and k over all heads (default ``d_model``); zoology's Based
    projects ``d_model`` straight to its r = 16 (``qk_dim=16`` with ``Based(project=False)``).
    Values keep ``d_model``."""

    def __init__(self, d_model: int, num_heads: int, feature_map: FeatureMapFactory,
                 use_norm: bool, chunk_size: int, mode: str, qk_norm: bool = False,
                 qk_dim: int | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(d_model, num_heads)
        self.qk_dim = d_model if qk_dim is None else qk_dim
        if self.qk_dim < 1 or self.qk_dim % num_heads:
            raise ValueError(f"qk_dim={self.qk_dim} must be a positive multiple of "
                             f"num_heads={num_heads}")
        self.qk_head_dim = self.qk_dim // num_heads
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.mode, self.chunk_size = mode, chunk_size
        self.qkv = nn.Linear(d_model, 2 * self.qk_dim + d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.phi_q = feature_map(self.qk_head_dim)
        self.phi_k = feature_map(self.qk_head_dim)
        if not isinstance(self.phi_q, nn.Module) or not hasattr(self.phi_q, "feature_dim"):
            raise ValueError("feature_map must build an nn.Module with a feature_dim attribute")
        self.norm = nn.RMSNorm(self.head_dim) if use_norm else nn.Identity()
        self.qk_norm = bool(qk_norm)

    def normalize_qk(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` ``(b, h, n, qk_head_dim)`` through the affine-free LayerNorm when ``qk_norm``."""
        return F.layer_norm(t, (self.qk_head_dim,)) if self.qk_norm else t

    @property
    def feature_dim(self) -> int:
        return self.phi_q.feature_dim

    def mix(self, x: torch.Tensor, f: torch.Tensor, g: torch.Tensor,
            v: torch.Tensor) -> torch.Tensor:
        """``x``: the mixer input ``(b, n, d_model)`` (for gates); ``f, g``: ``(b, h, n, m)``;
        ``v``: ``(b, h, n, head_dim)``; returns ``(b, h, n, head_dim)``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        sizes = [self.qk_dim, self.qk_dim, qkv.shape[-1] - 2 * self.qk_dim]
        q, k, v = (split_heads(t, self.num_heads) for t in qkv.split(sizes, dim=-1))
        y = self.mix(x, self.phi_q(self.normalize_qk(q)), self.phi_k(self.normalize_qk(k)), v)
        if isinstance(self.norm, nn.RMSNorm):  # in its weight's dtype: fp32 under autocast
            y = rms_norm_low(y, self.norm) if runs_low(y, self.norm) else \
                self.norm(y.to(self.norm.weight.dtype))
        return self.out(merge_heads(y))

    def state_size(self, seq_len: int) -> int:
        return self.feature_dim * self.head_dim * self.num_heads

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {**self.phi_q.hparams(), "normalize": self.normalize, "qk_norm": self.qk_norm}


class DecayGate(nn.Module):
    """Per-head, per-token log-decay ``log α = −softplus(x W + b)`` (Mamba2 / GLA style):
    ``(b, n, d_model) -> (b, heads, n)``, always ≤ 0.

    The bias starts at ``b_h = log(expm1(−log α_h))`` with α_h spaced geometrically in
    −log α over ``alpha_init`` = (0.99, 0.999) across heads (one head: α ≈ 0.9968), so the
    state starts out remembering ~100–1000 tokens; ``W`` has the default ``nn.Linear`` init,
    which moves −log α by a factor of about e^{±0.6} around that for unit-variance inputs.
    """

    def __init__(self, d_model: int, num_heads: int,
                 alpha_init: tuple[float, float] = (0.99, 0.999)):
        super().__init__()
        self.proj = nn.Linear(d_model, num_heads)
        lo, hi = (-math.log(a) for a in alpha_init)
        rates = torch.logspace(math.log10(lo), math.log10(hi), num_heads) if num_heads > 1 \
            else torch.tensor([math.sqrt(lo * hi)])
        with torch.no_grad():
            self.proj.bias.copy_(torch.log(torch.expm1(rates)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -F.softplus(self.proj(x)).transpose(1, 2)


class LinearAttention(FeatureMapAttention):
    """Multi-head causal linear attention with separate query and key feature maps.

    ``feature_map(qk_head_dim)`` is called twice (φ_Q, φ_K). ``output_norm`` applies a per-head
    RMSNorm to the attention output; by default it is on exactly when there is no denominator.

    The default is no denominator plus the output RMSNorm: with signed features (LLoPS) the
    denominator Σ f·g can cross zero, and in calibration runs a p=4 model with the sign-safe
    denominator stayed near chance long after the output-norm variant learned the task;
    ``sweeps/normalize.yaml`` compares the choices.
    """

    def __init__(self, d_model: int, num_heads: int, feature_map: FeatureMapFactory,
                 normalize: bool | str = False, output_norm: bool | None = None,
                 chunk_size: int = 64, mode: str = "chunked", eps: float = 1e-6,
                 qk_norm: bool = False, qk_dim: int | None = None):
        if mode not in MODES:
            raise ValueError(f"attention mode must be one of {MODES}, got {mode!r}")
        how = normalize_option(normalize)
        use_norm = how == "none" if output_norm is None else output_norm
        super().__init__(d_model, num_heads, feature_map, use_norm, chunk_size, mode, qk_norm,
                         qk_dim)
        self.normalize, self.eps = how, eps

    def log_decay(self, x: torch.Tensor) -> torch.Tensor | None:
        """``(b, h, n)`` log-decays of the gated state, or None (no gate)."""
        return None

    def mix(self, x: torch.Tensor, f: torch.Tensor, g: torch.Tensor,
            v: torch.Tensor) -> torch.Tensor:
        return linear_attention(f, g, v, mode=self.mode, chunk_size=self.chunk_size,
                                normalize=self.normalize, eps=self.eps,
                                log_decay=self.log_decay(x))


class GatedLinearAttention(LinearAttention):
    """:class:`LinearAttention` with a data-dependent decay of the state (mixer ``gated``):
    ``S_t = α_t S_{t−1} + g_t v_tᵀ`` with ``log α_t`` from a :class:`DecayGate`. The
    denominator, when one is used, decays the same way."""

    def __init__(self, d_model: int, num_heads: int, feature_map: FeatureMapFactory,
                 normalize: bool | str = False, output_norm: bool | None = None,
                 chunk_size: int = 64, mode: str = "chunked", eps: float = 1e-6,
                 qk_norm: bool = False, qk_dim: int | None = None):
        super().__init__(d_model, num_heads, feature_map, normalize, output_norm, chunk_size,
                         mode, eps, qk_norm, qk_dim)
        self.decay = DecayGate(d_model, num_heads)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        return self.decay(x)


class DeltaAttention(FeatureMapAttention):
    """Delta-rule attention over any feature map (mixers ``delta`` and, with ``gated``,
    ``gated_delta``): ``S_t = α_t (I − β_t g_t g_tᵀ) S_{t−1} + β_t g_t v_tᵀ``, ``y_t = S_tᵀ f_t``
    (:func:`arbench.attention.delta_attention`).

    f and g are L2-normalised after the feature maps (as DeltaNet does), which keeps the
    update a contraction; ``β = sigmoid(x W_β + b_β)`` per head and token; ``log α`` from a
    :class:`DecayGate` when ``gated`` (α = 1 otherwise). No denominator (``normalize`` must be
    false); the per-head output RMSNorm is on unless ``output_norm=False``.
    """

    def __init__(self, d_model: int, num_heads: int, feature_map: FeatureMapFactory,
                 gated: bool = False, normalize: bool | str = False,
                 output_norm: bool | None = None, chunk_size: int = 64, mode: str = "chunked",
                 qk_norm: bool = False, qk_dim: int | None = None):
        if mode not in DELTA_MODES:
            raise ValueError(f"delta rule mode must be one of {DELTA_MODES}, got {mode!r}")
        if normalize_option(normalize) != "none":
            raise ValueError(f"the delta rule has no denominator: normalize must be false, "
                             f"got {normalize!r}")
        super().__init__(d_model, num_heads, feature_map, output_norm is not False, chunk_size,
                         mode, qk_norm, qk_dim)
        self.normalize = "none"
        self.beta = nn.Linear(d_model, num_heads)
        self.decay = DecayGate(d_model, num_heads) if gated else None

    def mix(self, x: torch.Tensor, f: torch.Tensor, g: torch.Tensor,
            v: torch.Tensor) -> torch.Tensor:
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)  # (b, h, n)
        log_decay = None if self.decay is None else self.decay(x)
        return delta_attention(l2_normalize(f), l2_normalize(g), v, beta,
                               log_decay=log_decay, mode=self.mode, chunk_size=self.chunk_size)


class GatedDeltaAttention(DeltaAttention):
    """:class:`DeltaAttention` with the decay gate (mixer ``gated_delta``, Gated DeltaNet);
    the same arguments but ``gated``."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, gated=True, **kwargs)  # type: ignore[misc]


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


def causal_depthwise_conv(conv: nn.Conv1d, h: torch.Tensor) -> torch.Tensor:
    """``conv`` (depthwise, padded by ``kernel_size − 1``) applied causally to ``h``
    ``(b, n, d)``, returning ``(b, n, d)``: :func:`arbench.kernels.causal_conv` where the
    CPU kernels run, else :func:`arbench.naive.naive_causal_conv`."""
    if not use_cpu_kernels(h):
        return naive_causal_conv(h, conv)
    return kernels.causal_conv(h, conv.weight, conv.bias)


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
        return self.out(causal_depthwise_conv(self.conv, self.inp(x)) * self.gate(x))

    def state_size(self, seq_len: int) -> int:
        return self.kernel_size * self.d_model


class BaseConv(nn.Module):
    """zoology's short-convolution layer: ``y = conv(u) ⊙ (u W + b) + u`` on ``(b, n, d_model)``,
    a causal depthwise convolution (kernel ``kernel_size``, with bias) gated by one linear map,
    plus its input (mixer ``base_conv``; :class:`ShortConv` has three linear maps and no
    inner residual)."""

    def __init__(self, d_model: int, kernel_size: int = 3):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv kernel_size must be >= 1, got {kernel_size}")
        self.kernel_size, self.d_model = kernel_size, d_model
        self.projection = nn.Linear(d_model, d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model,
                              padding=kernel_size - 1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return causal_depthwise_conv(self.conv, u) * self.projection(u) + u

    def state_size(self, seq_len: int) -> int:
        return self.kernel_size * self.d_model


def mlp(d_model: int, expand: int = 4) -> nn.Module:
    """A GELU MLP ``d_model -> expand·d_model -> d_model``."""
    return nn.Sequential(nn.Linear(d_model, expand * d_model), nn.GELU(),
                         nn.Linear(expand * d_model, d_model))


__all__ = ["BaseConv", "DecayGate", "DeltaAttention", "FeatureMapAttention", "FeatureMapFactory",
           "GatedDeltaAttention", "GatedLinearAttention", "LinearAttention", "ShortConv",
           "SoftmaxAttention", "causal_depthwise_conv", "mlp"]
