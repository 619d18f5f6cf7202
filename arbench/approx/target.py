"""The target kernel (q·k)^p and ψ_p, the explicit degree-p expansion (symmetric form)."""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations_with_replacement

import torch

from arbench.checks import check_int


def check_p(p: object) -> int:
    """Return ``p``; raise ``ValueError`` unless it is an integer >= 1."""
    return check_int("p", p)


def poly_kernel(q: torch.Tensor, k: torch.Tensor, p: int) -> torch.Tensor:
    """``(q kᵀ)^p`` elementwise: ``q`` ``(nq, d)``, ``k`` ``(nk, d)`` -> ``(nq, nk)``."""
    return (q @ k.T).pow(check_p(p))


def monomial_count(dim: int, p: int) -> int:
    """Number of degree-p monomials in ``dim`` variables, ``C(dim + p - 1, p)``."""
    return math.comb(dim + p - 1, p)


@lru_cache(maxsize=32)
def monomials(dim: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index ``(D, p)`` of each monomial's variables and weight ``(D,)`` = √(multinomial)."""
    combos = list(combinations_with_replacement(range(dim), p))
    index = torch.tensor(combos, dtype=torch.long).reshape(len(combos), p)
    weights = []
    for combo in combos:
        denom = 1
        for c in set(combo):
            denom *= math.factorial(combo.count(c))
        weights.append(math.sqrt(math.factorial(p) / denom))
    return index, torch.tensor(weights, dtype=torch.float64)


def symmetric_power(x: torch.Tensor, p: int) -> torch.Tensor:
    """ψ_p(x) in its symmetric form: ``(..., r)`` -> ``(..., C(r + p - 1, p))``.

    Entry for the monomial Π x_i^{c_i} is √(p!/Π c_i!) · Π x_i^{c_i}, so that
    ``symmetric_power(a, p) · symmetric_power(b, p) = (a·b)^p`` exactly: the same Gram matrix
    as vec(x^{⊗p}) ∈ R^{r^p} with the repeated entries merged.
    """
    index, weight = monomials(x.shape[-1], check_p(p))
    return x[..., index].prod(dim=-1) * weight.to(x.dtype)
