"""Feature maps φ: ``(..., head_dim) -> (..., feature_dim)`` for linear attention.

Each map is an ``nn.Module`` with a ``feature_dim`` attribute and ``hparams()`` (the numbers a
sweep or a table reports). The mixers give queries and keys separate instances (the
approximation study's fixed PolySketchFormer shares one between them).

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

import itertools
import math

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from arbench import kernels
from arbench.checks import check_int
from arbench.kernels.compiled import compiled_cp_product
from arbench.naive import naive_cp_product, naive_projected_power, naive_taylor_features
from arbench.precision import cpu_kernels, use_cpu_kernels, use_cuda_kernels


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

    def flops_per_token(self) -> float:
        """FLOPs of one call on one token (one multiply or add = 1 FLOP). This default counts
        one call on a ``(1, head_dim)`` input with torch's FLOP counter on the reference forms,
        which sees matmuls only; the shipped maps override it with their full count."""
        like = next(itertools.chain(self.parameters(), self.buffers()), None)
        x = torch.zeros(1, self.head_dim, dtype=like.dtype if like is not None else None,
                        device=like.device if like is not None else None)
        with FlopCounterMode(display=False) as counter, torch.no_grad(), cpu_kernels(False):
            self(x)
        return float(counter.get_total_flops())


# ---- the weight layout the CP product's forms share ---------------------------------------------

def cp_weights(theta: torch.Tensor, bias: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``theta`` ``(rank, p, d, m)`` and ``bias`` ``(rank, p, m)`` or None as one matrix
    ``(d, p·rank·m)`` and one vector ``(p·rank·m,)``, factor-major: factor j of every rank is
    one contiguous block of ``rank·m`` columns."""
    rank, p, d, m = theta.shape
    w = theta.permute(2, 1, 0, 3).reshape(d, p * rank * m)
    b = None if bias is None else bias.permute(1, 0, 2).reshape(p * rank * m)  # same order
    return w, b


# ---- where the kernels run: the CPU kernel on a CPU (precision.use_cpu_kernels), the compiled
# CP product on a GPU (precision.use_cuda_kernels), else the reference -------------------------

def cp_polynomial(x: torch.Tensor, theta: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_r Π_j (x Θ_{j,r} + c_{j,r}) with ``theta`` of shape ``(rank, p, d, m)`` and ``bias``
    (the constants c, affine factors) of shape ``(rank, p, m)`` or None (c = 0): one matmul of x
    against all ``rank·p`` projections (:func:`cp_weights`), a product over p and a sum over
    rank (:func:`arbench.naive.naive_cp_product`; :func:`arbench.kernels.cp_product` on a CPU,
    :func:`arbench.kernels.compiled.compiled_cp_product` on a GPU).
    ``x``: ``(..., d)``; returns ``(..., m)``."""
    rank, p = theta.shape[:2]
    w, b = cp_weights(theta, bias)
    if p > 1 and use_cuda_kernels(x):
        return compiled_cp_product(x, w, p, rank, b)
    if p == 1 or not use_cpu_kernels(x):
        return naive_cp_product(x, w, p, rank, b)
    return kernels.cp_product(x, w, p, rank, b)


def power_map(x: torch.Tensor, w: torch.Tensor, p: int) -> torch.Tensor:
    """``(x @ w) ** p`` elementwise (:func:`arbench.naive.naive_projected_power`, or
    :func:`arbench.kernels.projected_power` on a CPU). ``x``: ``(..., d)``, ``w``: ``(d, m)``;
    returns ``(..., m)``."""
    if p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if not use_cpu_kernels(x):
        return naive_projected_power(x, w, p)
    return kernels.projected_power(x, w, p)


def _cp_flops(d: int, m: int, p: int, rank: int) -> float:
    """``Σ_r Π_j x Θ_{j,r}`` per token: projection, products, rank sum."""
    return 2.0 * d * p * rank * m + (p - 1) * rank * m + (rank - 1) * m


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
        self.head_dim = check_int("head_dim", head_dim)
        self.m = check_int("m", m)
        self.p = check_int("p", p)
        self.rank = check_int("rank", rank)
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

    def flops_per_token(self) -> float:
        """Projection ``2·d·p·t·m``, products ``(p−1)·t·m``, rank sum ``(t−1)·m`` [+ ``p·t·m``
        constants when affine] [+ ``m`` when squared]."""
        extra = (self.p * self.rank * self.m if self.affine else 0) + (
            self.m if self.square else 0)
        return _cp_flops(self.head_dim, self.m, self.p, self.rank) + extra

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

    ``theta``: ``(head_dim, m)``. LLoPS with rank 1 and all Θ_j equal: the LLoPS paper's reading
    of Flatten (SPEC §1), not FLatten's own focused map (``relu(x) / softplus(s)`` raised to
    the power 3 with its norm kept, feature dim = head dim).
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4,
                 temperature: float | None = None):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.m = check_int("m", m)
        self.p = check_int("p", p)
        self.feature_dim = m
        std = sketch_std(head_dim, m, p, 1, temperature)
        self.theta = nn.Parameter(torch.randn(head_dim, m) * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return power_map(x, self.theta, self.p)

    def flops_per_token(self) -> float:
        """Projection ``2·d·m`` and the power ``(p−1)·m``."""
        return 2.0 * self.head_dim * self.m + (self.p - 1) * self.m

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Flatten", "m": self.m, "p": self.p, "rank": 1}


class Based(FeatureMap):
    """BASED 2nd-order Taylor features of a learned projection x̃ = x W ∈ R^r.

    φ(x) = [1, x̃ / r^{1/4}, vec(x̃ x̃ᵀ) / (√2·√r)], so φ(q)·φ(k) = 1 + s + s²/2 with
    s = q̃·k̃ / √r. ``feature_dim = 1 + r + r²`` (273 for r = 16).

    ``project=False``: x̃ = x itself (no W; ``r`` must equal ``head_dim``), as zoology's Based
    layer does after projecting ``d_model`` straight to r (``model.qk_dim``).
    """

    def __init__(self, head_dim: int, r: int = 16, project: bool = True):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.r = check_int("r", r)
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
        if not use_cpu_kernels(xt):
            return naive_taylor_features(xt, a, b)
        return kernels.taylor_features(xt, a, b)

    def flops_per_token(self) -> float:
        """Projection ``2·d·r`` (none when ``project=False``), scaling ``r``, outer product
        and its scaling ``2·r²``."""
        r = self.r
        return (0.0 if self.proj is None else 2.0 * self.head_dim * r) + r + 2.0 * r * r

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Based", "m": self.feature_dim, "r": self.r, "p": 2, "rank": 1}


class PolySketch(FeatureMap):
    """PolySketchFormer's data-independent sketch: φ(x) = Π_j x G_j with fixed Gaussian G_j.

    ``sketch``: buffer ``(1, p, head_dim, m)``, drawn from a generator seeded by ``seed`` (not
    trained, identical for equal seeds). Unbiased for ``(q·k / temperature)^p`` (default 1).
    The LLoPS paper's reading (SPEC §1: LLoPS with fixed random Θ_j), so its weights can be
    negative; PolySketchFormer itself squares a degree-p/2 sketch (non-negative weights) and
    applies a LayerNorm to q and k first (SPEC §6).
    """

    def __init__(self, head_dim: int, m: int = 256, p: int = 4, seed: int = 0,
                 temperature: float = 1.0):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.m = check_int("m", m)
        self.p = check_int("p", p)
        self.seed = int(seed)
        self.feature_dim = m
        gen = torch.Generator().manual_seed(self.seed)
        std = sketch_std(head_dim, m, p, 1, temperature)
        sketch = torch.randn(1, p, head_dim, m, generator=gen) * std
        self.register_buffer("sketch", sketch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cp_polynomial(x, self.sketch.to(x.dtype))

    def flops_per_token(self) -> float:
        """As LLoPS with rank 1: ``2·d·p·m + (p−1)·m``."""
        return _cp_flops(self.head_dim, self.m, self.p, 1)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "PolySketch", "m": self.m, "p": self.p, "rank": 1}


class EluPlusOne(FeatureMap):
    """φ(x) = elu(x) + 1 (Katharopoulos et al.); ``feature_dim = head_dim``, no parameters."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.elu(x) + 1.0

    def flops_per_token(self) -> float:
        """``elu`` and the add: ``2·d``."""
        return 2.0 * self.head_dim

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "EluPlusOne", "m": self.feature_dim}


class Identity(FeatureMap):
    """φ(x) = x; ``feature_dim = head_dim``, no parameters (the plain dot-product kernel, e.g.
    for the delta rule as in DeltaNet)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def flops_per_token(self) -> float:
        return 0.0

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Identity", "m": self.feature_dim}


# ---- fixed maps of BASED's Figure 3 (zoology's feature maps), for the state-size frontier ----

class ReLU(FeatureMap):
    """φ(x) = max(x, eps) (a ReLU floored at ``eps`` = 1e-12, as zoology's, so a denominator
    never divides by 0); ``feature_dim = head_dim``, no parameters."""

    def __init__(self, head_dim: int, eps: float = 1e-12):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.feature_dim = head_dim
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).clamp(min=self.eps)

    def flops_per_token(self) -> float:
        """The floor: ``d`` comparisons."""
        return float(self.head_dim)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "ReLU", "m": self.feature_dim}


class Square(FeatureMap):
    """φ(x) = x ⊙ x elementwise (zoology's ``Square``); ``feature_dim = head_dim``, no
    parameters. Not a kernel of q·k: φ(q)·φ(k) = Σ_i q_i² k_i²."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.feature_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x

    def flops_per_token(self) -> float:
        return float(self.head_dim)

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Square", "m": self.feature_dim}


class CosFormer(FeatureMap):
    """cosFormer's map (Qin et al. 2022, as zoology applies it): for ``x`` ``(..., n, d)``
    with positions i = 1 … n on the second-to-last axis, φ(x)_i = [relu(x_i) sin(π i / 2n),
    relu(x_i) cos(π i / 2n)], so φ(q_i)·φ(k_j) = relu(q_i)·relu(k_j) cos(π (i − j) / 2n): a
    decay with distance set by the length n of the sequence being processed.
    ``feature_dim = 2·head_dim``, no parameters."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.feature_dim = 2 * head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-2]
        angle = torch.arange(1, n + 1, device=x.device, dtype=torch.float32) * (math.pi / (2 * n))
        r = torch.relu(x)
        return torch.cat([r * angle.sin().to(x.dtype).unsqueeze(-1),
                          r * angle.cos().to(x.dtype).unsqueeze(-1)], dim=-1)

    def flops_per_token(self) -> float:
        """The two scalings ``2·d`` (the ReLU is a comparison, not counted)."""
        return 2.0 * self.head_dim

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "CosFormer", "m": self.feature_dim}


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator,
                        unbiased: bool = False) -> torch.Tensor:
    """``(m, d)``: stacked ``d × d`` blocks of orthonormal rows (Q of the QR of a Gaussian
    matrix, its columns' signs set by R's diagonal so that the rows are uniformly distributed;
    the last block cut to the rows left). ``unbiased=False``: the whole divided by
    √(m / d), as zoology's Performer does (every row of norm √(d / m)). ``unbiased=True``: each
    row scaled to the norm of an independent Gaussian d-vector, so every row is marginally
    N(0, I_d) (FAVOR+'s orthogonal random features)."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator, dtype=torch.float64))
        blocks.append((q * r.diagonal().sign()).T)  # signs fixed: Haar-distributed rows
    rows = torch.cat(blocks)[:m]
    if unbiased:
        norms = torch.randn(m, d, generator=generator, dtype=torch.float64).norm(dim=1)
        return (rows * norms.unsqueeze(1)).float()
    return (rows / math.sqrt(m / d)).float()


class Performer(FeatureMap):
    """Performer's positive random features (FAVOR+, Choromanski et al. 2021): with
    x' = x / d^{1/4} and a fixed ``(m, d)`` matrix W of orthogonal rows (drawn from ``seed``, not
    trained), φ(x) = exp(−|x'|² / 2) · exp(x' Wᵀ) / √m. ``feature_dim = m`` (zoology's default
    256).

    ``unbiased=False`` (default, zoology's Performer, the one in BASED's Figure 3): W's rows have
    norm √(d / m) (:func:`orthogonal_gaussian`), so x' Wᵀ is small and the features are close
    to a constant times exp(−|x'|² / 2): they do not estimate the softmax kernel.
    ``unbiased=True``: W's rows are marginally N(0, I_d), and φ(q)·φ(k) is an unbiased estimate of
    exp(q·k / √d)."""

    def __init__(self, head_dim: int, m: int = 256, seed: int = 0, unbiased: bool = False):
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.m = check_int("m", m)
        self.seed = int(seed)
        self.unbiased = bool(unbiased)
        self.feature_dim = m
        gen = torch.Generator().manual_seed(self.seed)
        self.register_buffer("random_features",
                             orthogonal_gaussian(m, head_dim, gen, unbiased=self.unbiased))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.head_dim ** -0.25
        # one exponential: exp(−|x'|²/2) underflows to 0 and exp(x'Wᵀ) overflows to inf for
        # large x, and their product would be NaN where the feature is a finite number
        logits = x @ self.random_features.to(x.dtype).T - 0.5 * (x * x).sum(dim=-1, keepdim=True)
        return torch.exp(logits) / math.sqrt(self.m)

    def flops_per_token(self) -> float:
        """Scaling ``d``, the norm ``2·d``, the projection ``2·d·m``, the exponential and
        the scaling ``2·m``."""
        return 3.0 * self.head_dim + 2.0 * self.head_dim * self.m + 2.0 * self.m

    def hparams(self) -> dict[str, float | int | str | bool]:
        return {"feature_map": "Performer", "m": self.m, "unbiased": self.unbiased}
