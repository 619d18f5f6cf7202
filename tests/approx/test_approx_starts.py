import dataclasses

import pytest
import torch
from approx_helpers import gaussian_qk

from arbench.approx.als import features, relative_loss
from arbench.approx.methods import based_rank, llops_pair
from arbench.approx.records import StudyConfig
from arbench.approx.starts import (
    StartConfig,
    bilinear_start,
    data_start,
    embed_projection,
    monomial_factors,
)
from arbench.approx.study import check_settings
from arbench.approx.target import monomial_count, symmetric_power


@pytest.mark.parametrize("p", [1, 2, 3])
def test_monomial_factors_are_the_projected_power_as_rank_1_llops(p):
    d, r = 5, 4
    gen = torch.Generator().manual_seed(p)
    w = torch.randn(d, r, generator=gen, dtype=torch.float64)
    x = torch.randn(30, d, generator=gen, dtype=torch.float64)
    factors = monomial_factors(w, p)
    assert factors.shape == (p, d, monomial_count(r, p))
    torch.testing.assert_close(features(x, factors[None]), symmetric_power(x @ w, p))


@pytest.mark.parametrize("p, t", [(2, 1), (3, 2)])
def test_the_projection_start_is_the_best_bilinear_expansion(p, t):
    # with the spare columns zeroed, the LLoPS estimate is ((q W_Q)·(k W_K))^p exactly
    d, m = 6, 30
    q, k = gaussian_qk(80, d, seed=p)
    pair = llops_pair(d, m, p, t)
    r = embed_projection(pair.phi_q, pair.phi_k, q, k, spare_scale=0.0)
    assert r == based_rank(m, p) and monomial_count(r, p) <= m < monomial_count(r + 1, p)
    w_q, w_k = bilinear_start(q, k, r)
    expected = ((q.double() @ w_q) @ (k.double() @ w_k).T) ** p
    with torch.no_grad():
        got = features(q.double(), pair.phi_q.theta[:1].double()) @ \
            features(k.double(), pair.phi_k.theta[:1].double()).T
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_als_from_the_projection_ends_below_the_bilinear_start():
    d, m, p = 6, 12, 2
    q, k = gaussian_qk(120, d, seed=5)
    a = (q.double() @ k.double().T) ** p
    pair = llops_pair(d, m, p, 1)
    config = StartConfig(sweeps=5, tol=0.0, spare_scale=0.0)
    started = data_start(pair, q, k, a, config)
    r = based_rank(m, p)
    w_q, w_k = bilinear_start(q, k, r)
    bilinear = relative_loss(symmetric_power(q.double() @ w_q, p),
                             symmetric_power(k.double() @ w_k, p), a)
    assert started.name == f"als from projection r={r}" and started.steps == 5
    assert started.first_loss == pytest.approx(bilinear, rel=1e-6)
    assert started.last_loss < 0.9 * started.first_loss


def test_an_unknown_llops_start_is_one_line():
    fit = StudyConfig(ps=(2,)).fit
    config = StudyConfig(ps=(2,), fit=dataclasses.replace(
        fit, start=dataclasses.replace(fit.start, llops_from="random")))
    with pytest.raises(ValueError, match=r"^unknown LLoPS start 'random'; choose from "
                                         r"\['projection', 'sketch'\]$"):
        check_settings(config)
