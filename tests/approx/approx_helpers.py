"""Shared builders for the approximation tests (small sizes, fixed seeds)."""

from __future__ import annotations

import torch

from arbench.approx.methods import KernelPair, llops_pair
from arbench.model import RecallModel


def gaussian_qk(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``(n, d)`` with a decaying spectrum (so low rank is meaningful)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.arange(1, d + 1, dtype=torch.float32).pow(-0.5)
    return torch.randn(n, d, generator=gen) * scale, torch.randn(n, d, generator=gen) * scale


def llops_teacher(d: int, m: int, p: int, t: int, seed: int) -> KernelPair:
    """A random LLoPS pair (independent Θ for q and k): an exact rank-m degree-p kernel."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        teacher = llops_pair(d, m, p, t)
        with torch.no_grad():
            theta = teacher.phi_k.theta
            theta.copy_(torch.randn_like(theta) * theta.std())
    return teacher.requires_grad_(False)


def tiny_model(mixers: list[str], n_layers: int = 3, num_heads: int = 2,
               seed: int = 0) -> RecallModel:
    """A small RecallModel (vocab 64, d_model 16); needs no feature map unless 'linear'."""
    from arbench.featuremaps import LLoPS

    torch.manual_seed(seed)
    return RecallModel(vocab_size=64, d_model=16, n_layers=n_layers, mixers=mixers,
                       num_heads=num_heads, feature_map=lambda hd: LLoPS(hd, m=8, p=2))


def fake_lit(monkeypatch, models: dict[str, object]) -> None:
    """Stand in for ``arbench.lit``: ``LitRecall.load_from_checkpoint(path)`` returns an object
    whose ``.model`` is ``models[path]`` (the tests do not depend on the real module)."""
    import sys
    import types

    class LitRecall:
        def __init__(self, model: object):
            self.model = model

        @classmethod
        def load_from_checkpoint(cls, path: str, map_location: str = "cpu",
                                 weights_only: bool | None = None) -> LitRecall:
            assert weights_only is True  # a teacher is loaded tensors only
            if path not in models:
                raise RuntimeError("not a Lightning checkpoint")
            return cls(models[path])

    module = types.ModuleType("arbench.lit")
    module.LitRecall = LitRecall
    monkeypatch.setitem(sys.modules, "arbench.lit", module)
