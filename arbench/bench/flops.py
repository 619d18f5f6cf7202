"""FLOP counts from shapes (one multiply or one add = 1 FLOP, a multiply-add = 2).

Notation: n tokens, d head dim, m features, p degree, t CP rank, c chunk size,
dv value width (``d + 1`` with a denominator: the ones column rides along with v),
N = ⌈n/c⌉·c the padded length, nc = N/c chunks. Counts are per (batch, head) unless said.

Feature maps, per token and map (φ_Q and φ_K each): ``FeatureMap.flops_per_token()`` (the
shipped maps state their count, e.g. LLoPS ``2·d·p·t·m + (p−1)·t·m + (t−1)·m``; a map that
states none is counted by torch's FLOP counter).

Chunked causal linear attention (what ``arbench.attention._chunked`` executes, masked entries
included):

- intra-chunk: ``2·N·c·m`` (F_i G_iᵀ) ``+ 2·N·c·dv`` (masked scores · V_i);
- state update: ``2·(N−c)·m·dv`` (G_jᵀ V_j for chunks 0..nc−2) ``+ (nc−2)·m·dv`` (prefix sum);
- state read: ``2·(N−c)·m·dv`` (F_i S_i) ``+ (N−c)·dv`` (added to the intra part);
- denominator: ``n·(dv−1)`` divisions when normalised.

Gated chunked attention (``log_decay``, ``arbench.attention._chunked_gated``): intra-chunk as
above plus ``N·c`` (the decay mask); per-chunk updates and state reads for every chunk,
``2·N·m·dv`` each, ``+ 2·(nc−1)·m·dv`` (the decaying state recursion) ``+ N·dv`` (the read
added) ``+ 2·N·m`` (decays applied to the key and query features).

Chunked delta rule (``arbench.delta``, the UT transform), per chunk of c rows:
``2·c²·m`` three times (β-scaled K Kᵀ, W = T·βK, Q Kᵀ) ``+ 2·c²·dv`` twice (U = T·βV and the
masked scores · u) ``+ c³`` (the triangular solve against I) ``+ 2·c·m·dv`` three times
(u = U − W S, Q S, S += Kᵀ u); gating adds ``N·c + 2·N·m`` as above.

Softmax attention (``scaled_dot_product_attention``, causal): ``P = n(n+1)/2`` query–key pairs,
``4·d·P`` (QKᵀ and PV) ``+ 3·P`` (scale, exp, normalise). Only the causal pairs are counted:
the fused kernels skip the masked blocks.

Backward: a forward+backward pass counts ``3×`` the forward FLOPs (each product's backward is
two products of the same size), for every method alike, except a feature map without trainable
weights (PolySketch's fixed sketch, Performer's random features, BASED without its projection,
elu + 1): it needs the input's gradient only, so its map counts ``2×`` its forward
(:func:`linear_layer_fwd_bwd_flops`).
"""

from __future__ import annotations

from arbench.featuremaps import FeatureMap

FWD_BWD_FACTOR = 3.0


def chunked_attention_flops(n: int, m: int, dv: int, c: int, normalized: bool) -> float:
    """Chunked causal linear attention for one (batch, head); ``dv`` includes the ones column."""
    c = min(c, n)
    nc = -(-n // c)
    big_n = nc * c
    intra = 2.0 * big_n * c * m + 2.0 * big_n * c * dv
    update = 2.0 * (big_n - c) * m * dv + max(nc - 2, 0) * m * dv
    read = 2.0 * (big_n - c) * m * dv + (big_n - c) * dv
    denominator = n * (dv - 1) if normalized else 0.0
    return intra + update + read + denominator


def gated_attention_flops(n: int, m: int, dv: int, c: int, normalized: bool) -> float:
    """Gated chunked linear attention for one (batch, head); ``dv`` includes the ones column."""
    c = min(c, n)
    nc = -(-n // c)
    big_n = nc * c
    intra = 2.0 * big_n * c * m + 2.0 * big_n * c * dv + big_n * c
    if nc == 1:
        inter = 0.0
    else:
        inter = 4.0 * big_n * m * dv + 2.0 * (nc - 1) * m * dv + big_n * dv + 2.0 * big_n * m
    denominator = n * (dv - 1) if normalized else 0.0
    return intra + inter + denominator


def delta_attention_flops(n: int, m: int, dv: int, c: int, gated: bool) -> float:
    """Chunked delta rule (gated: Gated DeltaNet) for one (batch, head)."""
    c = min(c, n)
    nc = -(-n // c)
    per_chunk = 3 * 2.0 * c * c * m + 2 * 2.0 * c * c * dv + c ** 3 + 3 * 2.0 * c * m * dv
    decay = nc * c * c + 2.0 * nc * c * m if gated else 0.0
    return nc * per_chunk + decay


def softmax_attention_flops(n: int, d: int) -> float:
    """Causal softmax attention for one (batch, head): only the n(n+1)/2 causal pairs."""
    pairs = n * (n + 1) / 2.0
    return 4.0 * d * pairs + 3.0 * pairs


def state_update_flops(m: int, n: int, dv: int, c: int, normalized: bool,
                       rule: str = "linear") -> float:
    """Forward FLOPs of the chunked state update ``rule`` (``linear``, ``gated``, ``delta``,
    ``gated_delta``) on ``m`` features for one (batch, head)."""
    width = dv + 1 if normalized else dv
    if rule == "linear":
        return chunked_attention_flops(n, m, width, c, normalized)
    if rule == "gated":
        return gated_attention_flops(n, m, width, c, normalized)
    return delta_attention_flops(n, m, dv, c, gated=rule == "gated_delta")


def linear_layer_flops(phi_q: FeatureMap, phi_k: FeatureMap, n: int, dv: int, c: int,
                       normalized: bool, batch_heads: int, rule: str = "linear") -> float:
    """Forward FLOPs of φ_Q, φ_K and the chunked state update ``rule`` over ``batch_heads``
    (batch·heads)."""
    maps = n * (phi_q.flops_per_token() + phi_k.flops_per_token())
    attn = state_update_flops(phi_q.feature_dim, n, dv, c, normalized, rule)
    return batch_heads * (maps + attn)


def map_fwd_bwd_factor(phi: FeatureMap) -> float:
    """A map's forward+backward over its forward: ``3`` with trainable weights (the input's and
    the weights' gradients), ``2`` without (the input's only)."""
    trainable = any(p.requires_grad for p in phi.parameters())
    return FWD_BWD_FACTOR if trainable else FWD_BWD_FACTOR - 1


def linear_layer_fwd_bwd_flops(phi_q: FeatureMap, phi_k: FeatureMap, n: int, dv: int, c: int,
                               normalized: bool, batch_heads: int, rule: str = "linear") -> float:
    """Forward+backward FLOPs of :func:`linear_layer_flops`'s layer: ``3×`` the state update's
    forward, and each map's forward times :func:`map_fwd_bwd_factor`."""
    maps = n * sum(phi.flops_per_token() * map_fwd_bwd_factor(phi) for phi in (phi_q, phi_k))
    attn = state_update_flops(phi_q.feature_dim, n, dv, c, normalized, rule)
    return batch_heads * (maps + FWD_BWD_FACTOR * attn)


def linear_flops(n: int, d_in: int, d_out: int) -> float:
    """``nn.Linear`` without bias on n rows."""
    return 2.0 * n * d_in * d_out
