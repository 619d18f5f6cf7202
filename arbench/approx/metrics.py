"""Approximation errors of a kernel matrix estimate ``Â`` against the target ``A``.

- RMAE = Σ|Â − A| / Σ|A| over all (query, key) pairs (the paper's metric);
- relative Frobenius = ‖Â − A‖_F / ‖A‖_F (the metric the Eckart–Young floor bounds).
"""

from __future__ import annotations

import torch


def _pair(approx: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if approx.shape != target.shape:
        raise ValueError(f"shape mismatch: estimate {tuple(approx.shape)} vs "
                         f"target {tuple(target.shape)}")
    return approx.double(), target.double()


def rmae(approx: torch.Tensor, target: torch.Tensor) -> float:
    """Σ|Â − A| / Σ|A| for two ``(nq, nk)`` matrices."""
    a, t = _pair(approx, target)
    return float((a - t).abs().sum() / t.abs().sum())


def rel_frobenius(approx: torch.Tensor, target: torch.Tensor) -> float:
    """‖Â − A‖_F / ‖A‖_F for two ``(nq, nk)`` matrices."""
    a, t = _pair(approx, target)
    return float(torch.linalg.norm(a - t) / torch.linalg.norm(t))
