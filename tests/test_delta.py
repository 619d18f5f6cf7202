import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arbench.attention import delta_attention


def rand_inputs(n, m=5, dv=3, b=2, h=2, seed=0, dtype=torch.double):
    """Features f, unit-norm keys g, values v, β in (0, 1) and log-decays in [−1, −0.05]."""
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(b, h, n, m, generator=gen, dtype=dtype)
    g = F.normalize(torch.randn(b, h, n, m, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(b, h, n, dv, generator=gen, dtype=dtype)
    beta = torch.rand(b, h, n, generator=gen, dtype=dtype) * 0.9 + 0.05
    log_decay = -(torch.rand(b, h, n, generator=gen, dtype=dtype) * 0.95 + 0.05)
    return f, g, v, beta, log_decay


def naive_delta(f, g, v, beta, log_decay):
    """``S_t = α_t (I − β_t g_t g_tᵀ) S_{t−1} + β_t g_t v_tᵀ``, ``y_t = S_tᵀ f_t`` with the
    matrices written out, one (batch, head) and one token at a time."""
    m, dv = f.shape[-1], v.shape[-1]
    eye = torch.eye(m, dtype=f.dtype)
    out = torch.empty(*f.shape[:-1], dv, dtype=f.dtype)
    for b, h in np.ndindex(*f.shape[:2]):
        state = torch.zeros(m, dv, dtype=f.dtype)
        for t in range(f.shape[2]):
            k, bt = g[b, h, t], beta[b, h, t]
            alpha = 1.0 if log_decay is None else torch.exp(log_decay[b, h, t])
            state = alpha * (eye - bt * torch.outer(k, k)) @ state + bt * torch.outer(k, v[b, h, t])
            out[b, h, t] = state.T @ f[b, h, t]
    return out


@pytest.mark.parametrize("n", [1, 6, 16, 37])
@pytest.mark.parametrize("gated", [False, True])
def test_forms_match_the_definition_in_float64(n, gated):
    f, g, v, beta, log_decay = rand_inputs(n, seed=n)
    log_decay = log_decay if gated else None
    want = naive_delta(f, g, v, beta, log_decay)
    rec = delta_attention(f, g, v, beta, log_decay=log_decay, mode="recurrent")
    assert (rec - want).abs().max() <= 1e-10
    for chunk in (1, 4, 8, 16, 64):  # multiples of the chunk and not
        got = delta_attention(f, g, v, beta, log_decay=log_decay, chunk_size=chunk)
        assert got.dtype == torch.float64
        assert (got - rec).abs().max() <= 1e-10, chunk


def test_zero_log_decay_is_ungated():
    f, g, v, beta, _ = rand_inputs(19)
    zeros = torch.zeros_like(beta)
    for mode in ("recurrent", "chunked"):
        torch.testing.assert_close(
            delta_attention(f, g, v, beta, log_decay=zeros, mode=mode, chunk_size=8),
            delta_attention(f, g, v, beta, mode=mode, chunk_size=8))


def test_beta_one_with_orthonormal_keys_overwrites():
    # keys e_0, e_1, e_0 with β = 1: the second write to e_0 replaces the first value exactly
    m, dv = 4, 3
    keys = torch.eye(m, dtype=torch.double)[[0, 1, 0]]
    v = torch.randn(1, 1, 3, dv, dtype=torch.double)
    beta = torch.ones(1, 1, 3, dtype=torch.double)
    g = keys[None, None]
    for mode in ("recurrent", "chunked"):
        reads = [delta_attention(torch.eye(m, dtype=torch.double)[[j] * 3][None, None], g, v, beta,
                                 mode=mode, chunk_size=2)[0, 0, -1] for j in range(m)]
        torch.testing.assert_close(reads[0], v[0, 0, 2])  # overwritten, not summed
        torch.testing.assert_close(reads[1], v[0, 0, 1])
        torch.testing.assert_close(reads[2], torch.zeros(dv, dtype=torch.double))


def test_float32_matches_float64():
    f, g, v, beta, log_decay = rand_inputs(100, m=16, dv=8)
    want = delta_attention(f, g, v, beta, log_decay=log_decay, chunk_size=32)
    got = delta_attention(f.float(), g.float(), v.float(), beta.float(),
                          log_decay=log_decay.float(), chunk_size=32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("n,chunk", [(7, 3), (6, 6)])
def test_chunked_gradcheck(gated, n, chunk):
    f, g, v, beta, log_decay = rand_inputs(n, m=3, dv=2, b=1, h=2, seed=n)
    inputs = [f, g, v, beta] + ([log_decay] if gated else [])
    args = [t.requires_grad_() for t in inputs]

    def fn(f, g, v, beta, log_decay=None):
        return delta_attention(f, g, v, beta, log_decay=log_decay, chunk_size=chunk)

    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_causality_gradient_zero_for_future(mode):
    f, g, v, beta, log_decay = (t.requires_grad_() for t in rand_inputs(10, b=1, h=1))
    out = delta_attention(f, g, v, beta, log_decay=log_decay, mode=mode, chunk_size=4)
    i = 5
    out[0, 0, i].sum().backward()
    for t in (f, g, v, beta, log_decay):
        assert torch.all(t.grad[0, 0, i + 1:] == 0)
        assert t.grad[0, 0, : i + 1].abs().sum() > 0


def test_errors():
    f, g, v, beta, log_decay = rand_inputs(8)
    with pytest.raises(ValueError, match="delta rule mode must be one of"):
        delta_attention(f, g, v, beta, mode="quadratic")
    with pytest.raises(ValueError, match="shape mismatch"):
        delta_attention(f, g[..., :2], v, beta)
    with pytest.raises(ValueError, match=r"beta must have shape \(batch, heads, seq\)"):
        delta_attention(f, g, v, beta[..., :3])
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        delta_attention(f, g, v, beta + 1.0)
    with pytest.raises(ValueError, match="log_decay must be finite and <= 0"):
        delta_attention(f, g, v, beta, log_decay=-log_decay)
    with pytest.raises(ValueError, match="chunk_size must be"):
        delta_attention(f, g, v, beta, chunk_size=0)


def test_l2_normalize_is_fla_s_and_a_near_zero_key_writes_nothing():
    """Unit vectors for ordinary inputs (as ``F.normalize``), in the input's dtype computed in
    fp32 or wider; a near-zero feature vector (a ReLU map's all-floor keys) stays near zero,
    so its delta-rule write vanishes, where ``F.normalize`` makes it a full-strength write."""
    from arbench.delta import l2_normalize
    x = torch.randn(3, 7, 16, dtype=torch.double)
    torch.testing.assert_close(l2_normalize(x), F.normalize(x, dim=-1), rtol=1e-5, atol=1e-7)
    low = l2_normalize(x.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), F.normalize(x.bfloat16().float(), dim=-1),
                               rtol=1e-2, atol=1e-2)
    floor = torch.full((16,), 1e-12, dtype=torch.double)
    assert l2_normalize(floor).norm() < 1e-8 and F.normalize(floor, dim=0).norm() > 0.99
    f, g, v, beta, _ = rand_inputs(9, m=16)
    silent = g.clone()
    silent[..., 4, :] = l2_normalize(floor)
    dropped = g.clone()
    dropped[..., 4, :] = 0
    without = delta_attention(f, dropped, v, beta)
    torch.testing.assert_close(delta_attention(f, silent, v, beta), without, rtol=0, atol=1e-7)
    blown = g.clone()
    blown[..., 4, :] = F.normalize(floor, dim=0)
    assert (delta_attention(f, blown, v, beta) - without).abs().max() > 0.01
