"""The fixed maps of BASED's Figure 3 (ReLU, Square, CosFormer, Performer): each equals its
definition."""

import math

import pytest
import torch
from paths import ROOT

from arbench.featuremaps import CosFormer, Performer, ReLU, Square, orthogonal_gaussian
from arbench.registry import load_method_config


def test_relu_and_square_are_their_definitions():
    x = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(ReLU(8)(x), torch.where(x > 1e-12, x, torch.full_like(x, 1e-12)))
    assert (ReLU(8)(x) > 0).all()  # a denominator never divides by 0
    torch.testing.assert_close(Square(8)(x), x ** 2)
    assert ReLU(8).feature_dim == Square(8).feature_dim == 8


def test_cosformer_kernel_decays_with_distance():
    n, d = 7, 4
    q, k = torch.randn(n, d), torch.randn(n, d)
    fq, fk = CosFormer(d)(q), CosFormer(d)(k)
    assert fq.shape == (n, 2 * d)
    i = torch.arange(n, dtype=torch.float32)
    want = (q.relu() @ k.relu().T) * torch.cos(math.pi * (i[:, None] - i[None, :]) / (2 * n))
    torch.testing.assert_close(fq @ fk.T, want)


def test_orthogonal_gaussian_blocks():
    w = orthogonal_gaussian(12, 4, torch.Generator().manual_seed(0))
    assert w.shape == (12, 4)
    for block in w.split(4):  # zoology's: each block orthogonal, rows of norm sqrt(d / m)
        torch.testing.assert_close(block @ block.T, torch.eye(4) * 4 / 12)
    assert orthogonal_gaussian(6, 4, torch.Generator().manual_seed(0)).shape == (6, 4)
    u = orthogonal_gaussian(8, 4, torch.Generator().manual_seed(0), unbiased=True)
    for block in u.split(4):  # orthogonal rows, Gaussian norms
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-5, rtol=0)


def test_performer_unbiased_estimates_the_softmax_kernel():
    d, m = 8, 8192
    fm = Performer(d, m=m, seed=1, unbiased=True)
    q, k = torch.randn(16, d) * 0.5, torch.randn(16, d) * 0.5
    est = (fm(q) * fm(k)).sum(-1)
    exact = torch.exp((q * k).sum(-1) / math.sqrt(d))
    assert (est / exact - 1).abs().max() < 0.1
    again = Performer(d, m=m, seed=1, unbiased=True)
    assert torch.equal(again.random_features, fm.random_features)  # fixed by the seed
    assert not list(fm.parameters())  # nothing trained


def test_performer_as_zoology_has_nearly_constant_features():
    """zoology's rows of norm sqrt(d / m): φ(x) ≈ exp(-|x'|² / 2) / sqrt(m) in every feature."""
    d, m = 8, 256
    x = torch.randn(4, d)
    phi = Performer(d, m=m)(x)
    base = torch.exp(-0.5 * (x * x).sum(-1, keepdim=True) / math.sqrt(d)) / math.sqrt(m)
    assert ((phi / base) - 1).abs().max() < 0.5
    assert Performer(d, m=m).hparams() == {"feature_map": "Performer", "m": m, "unbiased": False}


@pytest.mark.parametrize("unbiased", [False, True])
def test_performer_stays_finite_for_large_inputs(unbiased: bool):
    """exp(−|x'|²/2) underflows and exp(x'Wᵀ) overflows at |x| ~ 10²; as one exponential the
    features are finite (their float64 value, rounded), never 0 · inf = NaN."""
    d, m = 16, 64
    fm = Performer(d, m=m, seed=0, unbiased=unbiased)
    x = torch.randn(32, d, generator=torch.Generator().manual_seed(0))
    x = 800.0 * x / x.norm(dim=-1, keepdim=True)
    phi = fm(x)
    assert torch.isfinite(phi).all()
    exact = fm.double()(x.double())
    torch.testing.assert_close(phi.double(), exact, rtol=1e-3, atol=1e-30)


@pytest.mark.parametrize("name,feature_map", [("relu", "ReLU"), ("square", "Square"),
                                               ("cosformer", "CosFormer"),
                                               ("performer", "Performer")])
def test_method_configs_build_the_map(name, feature_map):
    method = load_method_config(ROOT / "configs" / f"{name}.yaml")
    assert method.build(16).hparams()["feature_map"] == feature_map
