"""BASED inside LLoPS: the embedded maps reproduce the BASED kernel and layer exactly."""

import copy
from functools import partial

import pytest
import torch

from arbench.featuremaps import Based, LLoPS
from arbench.mixers import LinearAttention

F64 = torch.float64


def based_kernel(phi_q: Based, phi_k: Based, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """1 + s + s²/2 with s = q̃·k̃/√r, written from the definition."""
    s = (phi_q.proj(q) * phi_k.proj(k)).sum(-1) / phi_q.r ** 0.5
    return 1 + s + s * s / 2


@pytest.mark.parametrize("p", [2, 4])
def test_embedded_kernel_equals_based_kernel(p):
    torch.manual_seed(p)
    phi_q, phi_k = Based(8, r=5).double(), Based(8, r=5).double()
    q, k = torch.randn(11, 8, dtype=F64), torch.randn(11, 8, dtype=F64)
    lq, lk = LLoPS.from_based(phi_q, p=p), LLoPS.from_based(phi_k, p=p)
    assert lq.feature_dim == 1 + 5 + 15
    got = (lq(q) * lk(k)).sum(-1)
    torch.testing.assert_close(got, based_kernel(phi_q, phi_k, q, k), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, (phi_q(q) * phi_k(k)).sum(-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("normalize", ["none", "signed"])
def test_embedded_layer_gives_the_based_layer_output(p, normalize):
    torch.manual_seed(0)
    layer = LinearAttention(16, 2, partial(Based, r=4), normalize=normalize).double()
    embedded = copy.deepcopy(layer)
    embedded.phi_q = LLoPS.from_based(layer.phi_q, p=p, m=32)
    embedded.phi_k = LLoPS.from_based(layer.phi_k, p=p, m=32)
    x = torch.randn(3, 40, 16, dtype=F64)
    torch.testing.assert_close(embedded(x), layer(x), rtol=1e-10, atol=1e-10)


def test_spare_columns_zero_are_exact_and_small_random_ones_learn():
    torch.manual_seed(0)
    based = Based(8, r=3).double()
    x = torch.randn(20, 8, dtype=F64)
    zero = LLoPS.from_based(based, p=2, m=24)
    noisy = LLoPS.from_based(based, p=2, m=24, spare_std=1e-2)
    need = 1 + 3 + 6
    kernel = (zero(x) @ zero(x).t())
    torch.testing.assert_close(kernel, based(x) @ based(x).t(), rtol=1e-12, atol=1e-12)
    assert zero(x)[:, need:].abs().max() == 0
    assert 0 < noisy(x)[:, need:].abs().max() < 1e-2  # a product of two N(0, 1e-4) projections
    for fmap, dead in ((zero, True), (noisy, False)):
        fmap.zero_grad()
        fmap(x).pow(2).sum().backward()
        spare_grad = fmap.theta.grad[..., need:].abs().max()
        assert bool(spare_grad == 0) == dead


def test_embedding_errors_are_one_line():
    based = Based(8, r=16)
    with pytest.raises(ValueError, match="needs m >= 1 \\+ r \\+ r\\(r\\+1\\)/2 = 153 for r=16"):
        LLoPS.from_based(based, p=2, m=128)
    with pytest.raises(ValueError, match="needs p >= 2"):
        LLoPS.from_based(based, p=1)
