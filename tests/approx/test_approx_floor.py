import pytest
import torch
from approx_helpers import gaussian_qk

import arbench.approx.floor as floor_module
from arbench.approx.fit import FitConfig, fit_pair
from arbench.approx.floor import (
    eckart_young,
    explicit_sketch_kernel,
    fitted_optimal_sketch,
    optimal_linear_sketch,
)
from arbench.approx.methods import based_pair, flatten_pair, llops_pair, mlp_pair, polysketch_pair
from arbench.approx.metrics import rel_frobenius, rmae
from arbench.approx.target import check_p, monomial_count, poly_kernel, symmetric_power


def test_metrics_definitions():
    a = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    b = torch.tensor([[1.5, -2.0], [2.0, 4.0]])
    assert rmae(b, a) == pytest.approx(1.5 / 10)
    assert rel_frobenius(b, a) == pytest.approx((0.25 + 1) ** 0.5 / 30 ** 0.5)


@pytest.mark.parametrize("d,p", [(3, 1), (4, 2), (3, 3), (2, 4)])
def test_symmetric_power_gives_polynomial_kernel(d, p):
    q, k = torch.randn(5, d, dtype=torch.float64), torch.randn(6, d, dtype=torch.float64)
    psi_q = symmetric_power(q, p)
    assert psi_q.shape == (5, monomial_count(d, p))
    torch.testing.assert_close(psi_q @ symmetric_power(k, p).T, (q @ k.T) ** p)


def test_check_p():
    with pytest.raises(ValueError, match="p must be an integer >= 1, got 0"):
        check_p(0)


def test_floor_is_tail_of_singular_values():
    a = torch.randn(20, 15, dtype=torch.float64)
    s = torch.linalg.svdvals(a)
    floor = eckart_young(a, 4)
    assert floor.sq_error == pytest.approx(float((s[4:] ** 2).sum()))
    assert floor.rel_frobenius == pytest.approx(float((s[4:] ** 2).sum().sqrt() / a.norm()))
    assert eckart_young(a, 15).rel_frobenius == pytest.approx(0.0, abs=1e-12)


def test_eigh_path_reads_rounding_as_zero(monkeypatch):
    """Beyond EXACT_SVD_MAX rows the SVD comes from eigh(a aᵀ), whose eigenvalues of a rank-r
    matrix past r are rounding: read as 0, the floor at m ≥ r is 0, as the exact SVD's is."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(60, 5, dtype=torch.float64, generator=gen) @ \
        torch.randn(5, 40, dtype=torch.float64, generator=gen)
    exact, exact3 = eckart_young(a, 8), eckart_young(a, 3)
    monkeypatch.setattr(floor_module, "EXACT_SVD_MAX", 10)
    via_eigh = eckart_young(a, 8)
    assert exact.rel_frobenius < 1e-12 and via_eigh.rel_frobenius == 0.0
    u, s, v = floor_module.truncated_svd(a, 8)
    assert torch.isfinite(v).all() and (v[:, 5:] == 0).all()
    torch.testing.assert_close((u * s[:8]) @ v.T, a)
    assert eckart_young(a, 3).rel_frobenius == pytest.approx(exact3.rel_frobenius, rel=1e-9)


@pytest.mark.parametrize("p", [2, 3])
def test_theorem_3_1_sketch_reaches_the_floor(p):
    q, k = gaussian_qk(40, 4, seed=p)
    a = poly_kernel(q.double(), k.double(), p)
    floor = eckart_young(a, 6)
    w_q, w_k = optimal_linear_sketch(q, k, p, 6)
    assert w_q.shape == (monomial_count(4, p), 6)
    approx = explicit_sketch_kernel(q, k, p, 6, max_dim=10_000)
    assert rel_frobenius(approx, a) == pytest.approx(floor.rel_frobenius, rel=1e-6)
    assert explicit_sketch_kernel(q, k, p, 6, max_dim=monomial_count(4, p) - 1) is None


def test_gram_form_of_w_star_equals_explicit_least_squares():
    q, k = gaussian_qk(30, 3, seed=5)
    p, m = 2, 4
    phi_q, phi_k = fitted_optimal_sketch(q, k, p, m)
    w_q, w_k = optimal_linear_sketch(q, k, p, m)
    x, y = gaussian_qk(7, 3, seed=6)
    # ψ_p(x) W* with the explicit min-norm W* equals the Gram (kernel-trick) form on new points.
    torch.testing.assert_close(phi_q(x.double()), symmetric_power(x.double(), p) @ w_q)
    torch.testing.assert_close(phi_k(y.double()), symmetric_power(y.double(), p) @ w_k)


@pytest.mark.parametrize("p", [2, 3])
def test_floor_below_every_method(p):
    d, m = 6, 10
    q_tr, k_tr = gaussian_qk(200, d, seed=10)
    q_te, k_te = gaussian_qk(60, d, seed=11)
    a = poly_kernel(q_te.double(), k_te.double(), p)
    floor = eckart_young(a, m).rel_frobenius
    pairs = [polysketch_pair(d, m, p), mlp_pair(d, m, 16), flatten_pair(d, m, p),
             based_pair(d, m, p), llops_pair(d, m, p, 1), llops_pair(d, m, p, 4)]
    errors = {}
    for pair in pairs:
        assert pair.feature_dim <= m
        fit_pair(pair, q_tr, k_tr, lambda x, y: poly_kernel(x, y, p), FitConfig(steps=60))
        with torch.no_grad():
            errors[pair.name] = rel_frobenius(pair(q_te, k_te), a)
    phi_q, phi_k = fitted_optimal_sketch(q_tr, k_tr, p, m)
    errors["W* (train)"] = rel_frobenius(phi_q(q_te.double()) @ phi_k(k_te.double()).T, a)
    assert all(err >= floor - 1e-9 for err in errors.values()), (floor, errors)
