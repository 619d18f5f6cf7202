"""Feature-map pairs (φ_Q, φ_K) that approximate the kernel (q·k)^p with m features.

Every pair maps queries ``(nq, d)`` and keys ``(nk, d)`` to features ``(nq, m')``, ``(nk, m')``
with ``m' <= m``; ``pair(q, k)`` is the kernel estimate ``(nq, nk)``. The sketch-type maps
(LLoPS, Flatten) start with φ_K a copy of φ_Q at ``temperature = 1``, i.e. as an unbiased
sketch of (q·k)^p, and are then fitted with separate parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from arbench.approx.target import check_p, monomial_count, symmetric_power
from arbench.featuremaps import Flatten, LLoPS, PolySketch
from arbench.registry import MethodConfig


class KernelPair(nn.Module):
    """A query map and a key map; ``forward(q, k) = φ_Q(q) φ_K(k)ᵀ`` ``(nq, nk)``."""

    def __init__(self, name: str, phi_q: nn.Module, phi_k: nn.Module, feature_dim: int,
                 fitted: bool, rescale: Rescale | None = None, detail: str = ""):
        super().__init__()
        self.name = name
        self.detail = detail
        self.phi_q = phi_q
        self.phi_k = phi_k
        self.feature_dim = feature_dim
        self.fitted = fitted
        self._rescale = rescale

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.phi_q(q) @ self.phi_k(k).T

    @torch.no_grad()
    def rescale_(self, factor: float) -> bool:
        """Multiply the kernel estimate by ``factor > 0`` through the parameters.

        Returns ``False`` (and changes nothing) for maps without a rescaling rule.
        """
        if self._rescale is None or not factor > 0:
            return False
        self._rescale(self, factor)
        return True


Rescale = Callable[[KernelPair, float], None]


def scale_homogeneous(degree: int) -> Rescale:
    """Rule for maps homogeneous of ``degree`` in all their parameters (per side)."""
    def rescale(pair: KernelPair, factor: float) -> None:
        for prm in pair.parameters():
            prm.mul_(factor ** (1.0 / (2 * degree)))
    return rescale


def scale_last_linear(pair: KernelPair, factor: float) -> None:
    """Rule for MLPs: scale the last ``nn.Linear`` of each side by √factor."""
    for phi in (pair.phi_q, pair.phi_k):
        last = [mod for mod in phi.modules() if isinstance(mod, nn.Linear)][-1]
        for prm in last.parameters():
            prm.mul_(factor ** 0.5)


class ProjectedPower(nn.Module):
    """BASED-style map: learned projection to r dims, then the exact degree-p expansion.

    ``(n, d) -> (n, C(r + p − 1, p))``; φ_Q(q)·φ_K(k) = ((q W_Q)·(k W_K))^p.
    """

    def __init__(self, head_dim: int, r: int, p: int):
        super().__init__()
        self.p = check_p(p)
        self.proj = nn.Parameter(torch.randn(head_dim, r) / r ** 0.5)  # E[W Wᵀ] = I
        self.feature_dim = monomial_count(r, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return symmetric_power(x @ self.proj, self.p)


def based_rank(m: int, p: int) -> int:
    """Largest r with C(r + p − 1, p) <= m (0 when even r = 1 does not fit)."""
    r = 0
    while monomial_count(r + 1, p) <= m:
        r += 1
    return r


def polysketch_pair(d: int, m: int, p: int, seed: int = 0) -> KernelPair:
    """PolySketchFormer: one fixed Gaussian sketch shared by q and k, unbiased for (q·k)^p."""
    sketch = PolySketch(d, m=m, p=p, seed=seed, temperature=1.0)
    return KernelPair("PolySketchFormer", sketch, sketch, m, fitted=False)


def mlp_pair(d: int, m: int, hidden: int = 256) -> KernelPair:
    """Two independent 2-layer GELU MLPs ``d -> hidden -> m``."""
    def net() -> nn.Module:
        return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, m))
    return KernelPair("2-layer MLP", net(), net(), m, fitted=True, rescale=scale_last_linear)


def llops_pair(d: int, m: int, p: int, rank: int = 1) -> KernelPair:
    """LLoPS with CP rank t = ``rank``, temperature 1, φ_K initialised as a copy of φ_Q."""
    phi_q = LLoPS(d, m=m, p=p, rank=rank, temperature=1.0)
    return KernelPair(f"LLoPS t={rank}", phi_q, copy.deepcopy(phi_q), m, fitted=True,
                      rescale=scale_homogeneous(p))


def flatten_pair(d: int, m: int, p: int) -> KernelPair:
    """Flatten Transformer's (x Θ)^p, temperature 1, φ_K initialised as a copy of φ_Q."""
    phi_q = Flatten(d, m=m, p=p, temperature=1.0)
    return KernelPair("Flatten", phi_q, copy.deepcopy(phi_q), m, fitted=True,
                      rescale=scale_homogeneous(p))


def based_pair(d: int, m: int, p: int) -> KernelPair | None:
    """BASED-style pair with the largest r that fits m features; ``None`` if none fits."""
    r = based_rank(m, check_p(p))
    if r < 1:
        return None
    phi_q = ProjectedPower(d, r, p)
    return KernelPair("BASED-style", phi_q, copy.deepcopy(phi_q), phi_q.feature_dim,
                      fitted=True, rescale=scale_homogeneous(p), detail=f"r={r}")


def config_pair(d: int, method: MethodConfig) -> KernelPair:
    """A method config's feature map (``--method-config``): φ_K starts as a copy of φ_Q and is
    fitted separately when the map has trainable parameters (no rescaling rule)."""
    phi_q = method.build(d)
    fitted = any(prm.requires_grad for prm in phi_q.parameters())
    return KernelPair(method.name, phi_q, copy.deepcopy(phi_q), phi_q.feature_dim, fitted,
                      detail=type(phi_q).__name__)


PairBuilder = Callable[[], KernelPair | None]


def method_builders(d: int, m: int, p: int, ranks: list[int], seed: int = 0,
                    mlp_hidden: int = 256, configs: tuple[MethodConfig, ...] = (),
                    ) -> list[tuple[str, str, PairBuilder]]:
    """``(method key, row name, builder)`` for every method of the study, in table order.

    Keys: ``polysketch``, ``mlp``, ``flatten``, ``based``, ``llops`` (one row per rank t),
    ``config`` (one row per method config, named by its run name).
    """
    builders: list[tuple[str, str, PairBuilder]] = [
        ("polysketch", "PolySketchFormer", lambda: polysketch_pair(d, m, p, seed)),
        ("mlp", "2-layer MLP", lambda: mlp_pair(d, m, mlp_hidden)),
        ("flatten", "Flatten", lambda: flatten_pair(d, m, p)),
        ("based", "BASED-style", lambda: based_pair(d, m, p)),
    ]
    for t in ranks:
        builders.append(("llops", f"LLoPS t={t}", lambda t=t: llops_pair(d, m, p, t)))
    for method in configs:
        builders.append(("config", method.name, lambda method=method: config_pair(d, method)))
    return builders
