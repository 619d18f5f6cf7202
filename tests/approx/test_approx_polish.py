import pytest
import torch
from approx_helpers import gaussian_qk

from arbench.approx.methods import based_pair, llops_pair, polysketch_pair
from arbench.approx.polish import PolishConfig, loss_and_grad, polish
from arbench.approx.target import poly_kernel


def test_polish_stops_at_a_stationary_point_and_reports_the_gradient():
    # r = d = 4 (C(5, 2) = 10 features): ((q W_Q)·(k W_K))² can equal (q·k)² exactly, so the
    # stationary point L-BFGS reaches from a random start is (numerically) the zero loss.
    d, m, p = 4, 10, 2
    q, k = gaussian_qk(40, d, seed=2)
    q, k = q.double(), k.double()
    a = poly_kernel(q, k, p)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pair = based_pair(d, m, p).double()
    result = polish(pair, q, k, a, PolishConfig(steps=500, gtol=1e-6, ftol=0.0))
    assert result.stopped == "stationary" and 0 < result.steps < 500
    assert result.last_loss < 1e-10 < 0.1 < result.first_loss
    params = [prm for prm in pair.parameters() if prm.requires_grad]
    loss, grad_norm = loss_and_grad(pair, q, k, a, params)
    assert grad_norm == pytest.approx(result.grad_norm, rel=1e-6) and grad_norm <= 1e-6
    assert loss == pytest.approx(result.last_loss, rel=1e-6)


def test_polish_stops_at_its_step_limit_or_when_stalled():
    d, m, p = 4, 6, 3
    q, k = gaussian_qk(30, d, seed=3)
    a = poly_kernel(q, k, p)
    torch.manual_seed(0)
    capped = polish(llops_pair(d, m, p, 1), q, k, a, PolishConfig(steps=3, gtol=0.0))
    assert (capped.steps, capped.stopped) == (3, "max steps") and capped.grad_norm > 0
    stalled = polish(llops_pair(d, m, p, 1), q, k, a,
                     PolishConfig(steps=10_000, gtol=0.0, ftol=0.5, patience=2))
    assert stalled.stopped == "stalled" and stalled.steps < 10_000


def test_polish_leaves_unfitted_maps_alone():
    q, k = gaussian_qk(20, 4, seed=0)
    sketch = polysketch_pair(4, 8, 2)
    before = sketch(q, k).clone()
    result = polish(sketch, q, k, poly_kernel(q, k, 2), PolishConfig())
    assert result.steps == 0 and result.stopped == ""
    torch.testing.assert_close(sketch(q, k), before)


def noisy_fit(steps):
    """12 noisy training pairs, 28 clean validation ones, a fresh seeded LLoPS t = 2 pair:
    fitting the noise raises the validation loss. Returns (pair, result, q, k, a, noisy)."""
    q, k = gaussian_qk(40, 4, seed=0)
    q, k = q.double(), k.double()
    a = poly_kernel(q, k, 3)
    noisy = a + torch.randn(a.shape, generator=torch.Generator().manual_seed(0),
                            dtype=torch.float64) * a.std() * 0.5
    torch.manual_seed(0)
    pair = llops_pair(4, 6, 3, 2).double()
    result = polish(pair, q[:12], k[:12], noisy[:12, :12],
                    PolishConfig(steps=steps, gtol=0.0, ftol=0.0, patience=5),
                    val=(q[12:], k[12:], a[12:, 12:]))
    return pair, result, q, k, a, noisy


def test_polish_with_validation_pairs_keeps_its_least_validation_loss():
    # the polish stops where the validation loss has not improved for 5 steps and returns
    # its best parameters
    pair, result, q, k, a, noisy = noisy_fit(300)
    assert result.stopped == "validation" and result.steps < 300
    with torch.no_grad():
        kept = float((pair(q[12:], k[12:]) - a[12:, 12:]).pow(2).sum() / a[12:, 12:].pow(2).sum())
    assert kept == pytest.approx(result.val_loss, rel=1e-9)
    params = [prm for prm in pair.parameters() if prm.requires_grad]
    loss, grad_norm = loss_and_grad(pair, q[:12], k[:12], noisy[:12, :12], params)
    assert (loss, grad_norm) == pytest.approx((result.last_loss, result.grad_norm), rel=1e-9)


def test_a_step_cap_that_keeps_an_earlier_step_says_so():
    # capped before the validation patience runs out, past the least validation loss: the
    # kept parameters are an earlier step's, and the stop reason names that beside the cap
    full = noisy_fit(300)[1]
    capped = noisy_fit(full.steps - 2)[1]
    assert capped.stopped == "max steps, step of least validation loss kept"
    assert capped.val_loss == pytest.approx(full.val_loss, rel=1e-9)
