
import pytest
import torch

from arbench import featuremaps
from arbench.featuremaps import (
    Based,
    EluPlusOne,
    FeatureMap,
    Flatten,
    Identity,
    LLoPS,
    PolySketch,
    cp_polynomial,
)
from arbench.registry import FEATURE_MAPS


@pytest.fixture(autouse=True)
def float64():
    """Exact identities are checked in float64; the default dtype is restored afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def psi(x: torch.Tensor, p: int) -> torch.Tensor:
    """vec(x ⊗ … ⊗ x): (n, d) -> (n, d^p), first factor most significant."""
    out = x
    for _ in range(p - 1):
        out = (out.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    return out


def khatri_rao_sum(theta: torch.Tensor) -> torch.Tensor:
    """Ŵ = Σ_r Θ_{1,r} ⊙ … ⊙ Θ_{p,r}: (d^p, m), column i the Kronecker product of columns i."""
    rank, p, d, m = theta.shape
    total = torch.zeros(d ** p, m, dtype=theta.dtype)
    for r in range(rank):
        w = theta[r, 0]
        for j in range(1, p):
            w = (w.unsqueeze(1) * theta[r, j].unsqueeze(0)).reshape(-1, m)
        total += w
    return total


@pytest.mark.parametrize("d,p,t,m", [(3, 3, 2, 5), (2, 4, 3, 4), (4, 2, 1, 7), (3, 1, 2, 3)])
def test_llops_equals_khatri_rao_expansion(d, p, t, m):
    fm = LLoPS(d, m=m, p=p, rank=t)
    x = torch.randn(11, d)
    explicit = psi(x, p) @ khatri_rao_sum(fm.theta.detach())
    torch.testing.assert_close(fm(x), explicit, rtol=1e-10, atol=1e-10)
    # So the kernel is a learned rank-m polynomial kernel: φ(q)·φ(k) = ψ(q) Ŵ Ŵᵀ ψ(k).
    q, k = torch.randn(5, d), torch.randn(6, d)
    w = khatri_rao_sum(fm.theta.detach())
    torch.testing.assert_close(fm(q) @ fm(k).T, psi(q, p) @ w @ w.T @ psi(k, p).T)


def test_psi_gives_polynomial_kernel():
    q, k = torch.randn(4, 3), torch.randn(5, 3)
    torch.testing.assert_close(psi(q, 3) @ psi(k, 3).T, (q @ k.T) ** 3)


def test_square_option():
    fm = LLoPS(4, m=6, p=3, rank=2, square=True)
    x = torch.randn(7, 4)
    torch.testing.assert_close(fm(x), cp_polynomial(x, fm.theta) ** 2)
    assert (fm(x) >= 0).all()


def test_flatten_is_llops_with_shared_theta():
    flat = Flatten(5, m=8, p=3)
    ll = LLoPS(5, m=8, p=3, rank=1)
    with torch.no_grad():
        ll.theta.copy_(flat.theta.expand(1, 3, 5, 8))
    x = torch.randn(9, 5)
    torch.testing.assert_close(flat(x), ll(x))


def test_based_kernel_is_taylor():
    fm = Based(8, r=4)
    assert fm.feature_dim == 1 + 4 + 16
    assert Based(128).feature_dim == 273
    q, k = torch.randn(6, 8), torch.randn(7, 8)
    s = fm.proj(q) @ fm.proj(k).T / 4 ** 0.5
    torch.testing.assert_close(fm(q) @ fm(k).T, 1 + s + s ** 2 / 2)


def test_polysketch_fixed_and_seeded():
    a, b, c = PolySketch(6, m=16, p=2, seed=3), PolySketch(6, m=16, p=2, seed=3), \
        PolySketch(6, m=16, p=2, seed=4)
    assert sum(p.numel() for p in a.parameters() if p.requires_grad) == 0
    assert torch.equal(a.sketch, b.sketch) and not torch.equal(a.sketch, c.sketch)
    assert "sketch" in a.state_dict()


def test_polysketch_unbiased_for_polynomial_kernel():
    d, p = 4, 2
    q, k = torch.randn(d), torch.randn(d)
    est = torch.stack([PolySketch(d, m=64, p=p, seed=s)(q) @ PolySketch(d, m=64, p=p, seed=s)(k)
                       for s in range(400)])
    target = (q @ k) ** p
    assert abs(est.mean() - target) < 4 * est.std() / 20 + 1e-6


@pytest.mark.parametrize("p", range(1, 9))
def test_init_scale_sane_up_to_p8(p):
    torch.manual_seed(p)
    d, m = 32, 64
    q, k = torch.randn(256, d), torch.randn(256, d)  # unit-variance coordinates
    for fm_q, fm_k in [(LLoPS(d, m, p), LLoPS(d, m, p)), (LLoPS(d, m, p, rank=4),
                                                         LLoPS(d, m, p, rank=4))]:
        kern = (fm_q(q) * fm_k(k)).sum(-1)
        assert torch.isfinite(kern).all()
        scale = kern.std().item()
        assert 0.2 < scale < 5, (p, scale)  # variance-preserving: std ≈ 1 for every p


def test_init_unbiased_on_average():
    d, m, p = 8, 32, 3
    q = torch.randn(d)
    k = q + 0.3 * torch.randn(d)
    est = []
    for s in range(300):
        torch.manual_seed(s)
        fm = LLoPS(d, m, p, rank=2, temperature=3.0)
        est.append(fm(q) @ fm(k))
    est = torch.stack(est)
    target = (q @ k / 3.0) ** p
    assert abs(est.mean() - target) < 4 * est.std() / 300 ** 0.5


def test_elu_plus_one_positive():
    fm = EluPlusOne(4)
    assert fm.feature_dim == 4 and (fm(torch.randn(10, 4)) > 0).all()


def test_identity_map():
    fm = Identity(6)
    x = torch.randn(3, 6)
    assert fm.feature_dim == 6 and torch.equal(fm(x), x)
    assert fm.hparams() == {"feature_map": "Identity", "m": 6}
    with pytest.raises(ValueError, match="head_dim must be an integer >= 1"):
        Identity(0)


@pytest.mark.parametrize("cls,kwargs,match", [
    (LLoPS, dict(p=0), "p must be an integer >= 1"),
    (LLoPS, dict(m=-3), "m must be an integer >= 1"),
    (LLoPS, dict(rank=0), "rank must be an integer >= 1"),
    (Flatten, dict(p=0), "p must be"),
    (PolySketch, dict(m=0), "m must be"),
    (Based, dict(r=0), "r must be"),
])
def test_bad_hyperparameters(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(8, **kwargs)


def test_batched_shapes():
    for fm in [LLoPS(8, 16, 2, rank=3), Flatten(8, 16, 2), Based(8, 4), PolySketch(8, 16, 3)]:
        out = fm(torch.randn(2, 3, 5, 8))
        assert out.shape == (2, 3, 5, fm.feature_dim)


@pytest.mark.parametrize("p,rank", [(2, 1), (3, 2)])
def test_affine_llops_meets_the_extended_khatri_rao_identity(p, rank):
    """φ(x) = ψ_p([x, 1]) Ŵ, Ŵ[:, i] = Σ_r ⊗_j [Θ_{j,r}[:, i]; c_{j,r}[i]] (column-wise
    Kronecker products of the factors with their constants appended)."""
    torch.manual_seed(0)
    d, m = 3, 5
    fm = LLoPS(d, m=m, p=p, rank=rank, affine=True).double()
    with torch.no_grad():
        fm.bias.normal_()
    x = torch.randn(7, d, dtype=torch.double)
    xh = torch.cat([x, torch.ones(7, 1, dtype=torch.double)], dim=-1)  # [x, 1]
    psi = xh
    for _ in range(p - 1):  # ψ_p([x, 1]) = [x, 1]^{⊗p}, row by row
        psi = (psi.unsqueeze(-1) * xh.unsqueeze(-2)).flatten(-2)
    factors = torch.cat([fm.theta, fm.bias.unsqueeze(2)], dim=2).detach()  # (t, p, d+1, m)
    w_hat = torch.zeros((d + 1) ** p, m, dtype=torch.double)
    for r in range(rank):
        col = factors[r, 0]
        for j in range(1, p):
            col = (col.unsqueeze(1) * factors[r, j].unsqueeze(0)).flatten(0, 1)
        w_hat += col
    torch.testing.assert_close(fm(x), psi @ w_hat)
    assert fm.hparams()["affine"] is True
    plain = LLoPS(d, m=m, p=p, rank=rank, affine=True)  # c = 0 at init: the plain map
    torch.testing.assert_close(plain(x.float()), cp_polynomial(x.float(), plain.theta))


def test_flatten_is_power_of_the_projection():
    fm = Flatten(6, m=5, p=4)
    x = torch.randn(3, 9, 6)
    torch.testing.assert_close(fm(x), (x @ fm.theta).pow(4))
    with pytest.raises(ValueError, match="p must be an integer >= 1, got 0"):
        featuremaps.power_map(x, fm.theta, 0)


@pytest.mark.parametrize("name", sorted(FEATURE_MAPS))
def test_flops_per_token_counts_at_least_the_matmuls(name):
    """Each shipped map's stated count ≥ the matmul FLOPs torch's counter sees, within the few
    elementwise operations the counter does not see."""
    fm = FEATURE_MAPS[name](64, **({"r": 4} if name == "based" else {}))
    counted = FeatureMap.flops_per_token(fm)  # the default: torch's FLOP counter
    assert counted <= fm.flops_per_token() <= 1.1 * counted + 2 * 64


def test_default_flops_per_token_is_torch_s_count():
    class Squares(FeatureMap):
        def __init__(self, head_dim: int, m: int = 5):
            super().__init__()
            self.head_dim, self.feature_dim = head_dim, m
            self.w = torch.nn.Parameter(torch.randn(head_dim, m))

        def forward(self, x):
            return (x @ self.w) ** 2

    assert Squares(7).flops_per_token() == 2 * 7 * 5
    assert Squares(7).hparams() == {"feature_map": "Squares", "m": 5}
