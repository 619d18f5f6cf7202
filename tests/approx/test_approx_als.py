import pytest
import torch
from approx_helpers import gaussian_qk, llops_teacher

from arbench.approx.als import (
    als_start,
    balance_factors,
    balance_sides,
    features,
    normal_matvec,
    normal_matvec_reference,
    projections,
    relative_loss,
    row_blocks,
    solve_factor,
)
from arbench.approx.floor import eckart_young
from arbench.approx.methods import llops_pair
from arbench.approx.metrics import rel_frobenius
from arbench.approx.starts import bilinear_start


def test_reference_features_equal_the_llops_map():
    d, m, p, t = 5, 7, 3, 2
    pair = llops_pair(d, m, p, t)
    x = torch.randn(11, d)
    torch.testing.assert_close(features(x, pair.phi_q.theta.detach()), pair.phi_q(x).detach())


def test_rebalancing_leaves_the_estimate_unchanged():
    d, m, p, t = 4, 6, 3, 2
    q, k = gaussian_qk(20, d, seed=1)
    q, k = q.double(), k.double()
    gen = torch.Generator().manual_seed(0)
    theta_q = torch.randn(t, p, d, m, generator=gen, dtype=torch.float64)
    theta_k = torch.randn(t, p, d, m, generator=gen, dtype=torch.float64) * 3
    before = features(q, theta_q) @ features(k, theta_k).T
    new_q, new_k = balance_sides(balance_factors(theta_q), balance_factors(theta_k), q, k)
    torch.testing.assert_close(features(q, new_q) @ features(k, new_k).T, before)
    norms = new_q.norm(dim=2)  # (t, p, m): equal over the factors j
    torch.testing.assert_close(norms, norms[:, :1].expand_as(norms))
    torch.testing.assert_close(features(q, new_q).norm(dim=0), features(k, new_k).norm(dim=0))


@pytest.mark.parametrize("t, budget", [(1, 1 << 21), (3, 7 * 3 * 8 * 3), (2, 1)])
def test_blocked_normal_operator_equals_the_reference(t, budget):
    # budgets: one block; blocks of 3 rows with a short last one (n = 50); one row each
    n, d, m = 50, 4, 7
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    others = torch.randn(t, n, m, generator=gen, dtype=torch.float64)
    gram = torch.randn(m, m, generator=gen, dtype=torch.float64)
    theta = torch.randn(t, d, m, generator=gen, dtype=torch.float64)
    blocks = row_blocks(others, budget)
    assert [start for start, _ in blocks] == list(range(0, n, blocks[0][1].shape[0]))
    assert blocks[0][1].shape[0] == min(n, max(1, budget // (t * m * 8)))
    assert all(b.is_contiguous() for _, b in blocks)
    torch.testing.assert_close(torch.cat([b for _, b in blocks]), others.permute(1, 0, 2))
    torch.testing.assert_close(normal_matvec(x, blocks, gram, theta),
                               normal_matvec_reference(x, others, gram, theta),
                               rtol=1e-12, atol=1e-12)


def test_factor_update_is_the_least_squares_solution():
    # One factor's subproblem written out as an explicit linear least-squares problem.
    d, m, p, t, n = 3, 4, 2, 2, 30
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    f = torch.randn(n + 5, m, generator=gen, dtype=torch.float64)  # the other side's features
    a = torch.randn(n, n + 5, generator=gen, dtype=torch.float64)
    theta = torch.randn(t, p, d, m, generator=gen, dtype=torch.float64)
    others = projections(x, theta)[:, 1]  # P_r for j = 0 with p = 2
    design = torch.einsum("id,rim,lm->ilrdm", x, others, f).reshape(n * (n + 5), -1)
    exact = torch.linalg.lstsq(design, a.reshape(-1, 1), driver="gelsd").solution  # SVD-based

    def residual(factor: torch.Tensor) -> float:
        return float((design @ factor.reshape(-1, 1) - a.reshape(-1, 1)).pow(2).sum())

    start = theta[:, 0]
    found = solve_factor(x, others, f.T @ f, a @ f, start, iters=t * d * m)
    # the design is rank-deficient (several minimisers): compare the minimum reached
    assert residual(found) == pytest.approx(residual(exact), rel=1e-7)
    assert residual(exact) < 0.5 * residual(start)


@pytest.mark.parametrize("seed", [0, 1])
def test_als_recovers_an_exactly_low_rank_target(seed):
    # Targets from a random LLoPS pair with the same m, p, t: zero error is reachable, and ALS
    # from a random sketch start gets there (each sweep's loss no higher than the last).
    d, m, p, t = 8, 4, 2, 1
    teacher = llops_teacher(d, m, p, t, seed=101 + seed)
    q, k = gaussian_qk(300, d, seed=p)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pair = llops_pair(d, m, p, t)
    result = als_start(pair.phi_q, pair.phi_k, q[:150], k[:150], teacher(q[:150], k[:150]),
                       sweeps=150, tol=0.0)
    assert result.losses[-1] < 1e-10 < result.losses[0]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(result.losses, result.losses[1:]))
    with torch.no_grad():
        err = rel_frobenius(pair(q[150:], k[150:]), teacher(q[150:], k[150:]))
    assert err < 1e-4


def test_als_refuses_affine_maps():
    from arbench.featuremaps import LLoPS

    phi = LLoPS(4, m=4, p=2, affine=True)
    q, k = gaussian_qk(10, 4, seed=0)
    with pytest.raises(ValueError, match="plain LLoPS"):
        als_start(phi, phi, q, k, (q @ k.T) ** 2, sweeps=1)


@pytest.mark.parametrize("r", [2, 5])
def test_bilinear_start_is_the_best_rank_r_approximation_of_qk(r):
    q, k = gaussian_qk(60, 5, seed=7)
    w_q, w_k = bilinear_start(q, k, r)
    a = q.double() @ k.double().T
    approx = (q.double() @ w_q) @ (k.double() @ w_k).T
    assert rel_frobenius(approx, a) == pytest.approx(eckart_young(a, r).rel_frobenius,
                                                     abs=1e-9)


def test_a_higher_rank_grows_from_the_rank_1_fit_and_ends_no_worse():
    d, m, p = 6, 8, 3
    q, k = gaussian_qk(80, d, seed=9)
    a = (q.double() @ k.double().T) ** p
    results = {}
    for t in (1, 2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(4)
            pair = llops_pair(d, m, p, t)
        results[t] = als_start(pair.phi_q, pair.phi_k, q, k, a, sweeps=15, tol=0.0)
    one, two = results[1].losses, results[2].losses
    assert results[2].sweeps == 30
    # stage 1 of t = 2 is the t = 1 fit: from the first sweep on, ALS does not depend on the
    # start's scale (only the loss before it does)
    assert two[1:len(one)] == pytest.approx(one[1:], rel=1e-4)
    assert two[-1] < one[-1]


def test_a_grown_fit_that_ends_above_rank_1_keeps_the_rank_1_fit():
    """Rank 1 starts at an exact rank-1 target's factors (zero loss); growing rank 2 raises the
    loss and two sweeps do not win that back, so t = 2 returns the rank-1 fit, rank 2 zero."""
    d, m, p = 5, 6, 3
    q, k = gaussian_qk(60, d, seed=3)
    teacher = llops_teacher(d, m, p, 1, seed=11)
    with torch.no_grad():
        a = teacher.phi_q(q).double() @ teacher.phi_k(k).double().T
    results, pairs = {}, {}
    for t in (1, 2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(4)
            pairs[t] = llops_pair(d, m, p, t)
        with torch.no_grad():
            pairs[t].phi_q.theta[:1] = teacher.phi_q.theta
            pairs[t].phi_k.theta[:1] = teacher.phi_k.theta
        results[t] = als_start(pairs[t].phi_q, pairs[t].phi_k, q, k, a, sweeps=2, tol=0.0)
    assert results[2].stopped == "max sweeps, rank-1 fit kept"
    assert results[2].losses[-1] == results[1].losses[-1] < results[2].losses[3]
    assert torch.count_nonzero(pairs[2].phi_q.theta[1:]) == 0
    with torch.no_grad():
        torch.testing.assert_close(pairs[2].phi_q(q) @ pairs[2].phi_k(k).T,
                                   pairs[1].phi_q(q) @ pairs[1].phi_k(k).T)


def noisy_split(seed: int, d: int = 4, p: int = 3) -> tuple[torch.Tensor, ...]:
    """12 training pairs of (q·k)^p plus noise (half its std) and 28 clean validation ones:
    a fit of the noise on so few pairs raises the validation loss."""
    q, k = gaussian_qk(40, d, seed=seed)
    q, k = q.double(), k.double()
    a = (q @ k.T) ** p
    gen = torch.Generator().manual_seed(seed)
    noisy = a + torch.randn(a.shape, generator=gen, dtype=torch.float64) * a.std() * 0.5
    return q[:12], k[:12], noisy[:12, :12], q[12:], k[12:], a[12:, 12:]


@pytest.mark.parametrize("t", [1, 3])
def test_als_with_validation_pairs_keeps_its_least_validation_loss_and_stops_early(t):
    q, k, a, q_val, k_val, a_val = noisy_split(seed=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        pair = llops_pair(4, 6, 3, t)
    result = als_start(pair.phi_q, pair.phi_k, q, k, a, sweeps=40, tol=0.0,
                       val=(q_val, k_val, a_val), patience=3)
    assert result.stopped.startswith("validation") and result.sweeps < 40 * (1 + (t > 1))
    assert result.val_losses[-1] == min(result.val_losses) < max(result.val_losses)
    with torch.no_grad():
        kept = relative_loss(pair.phi_q(q_val).double(), pair.phi_k(k_val).double(), a_val)
        fitted = relative_loss(pair.phi_q(q).double(), pair.phi_k(k).double(), a)
    assert kept == pytest.approx(result.val_losses[-1], rel=1e-5)
    assert fitted == pytest.approx(result.losses[-1], rel=1e-5)
    assert len(result.val_losses) == len(result.losses)
