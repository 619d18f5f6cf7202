import numpy as np
import pytest
import torch

from arbench.attention import linear_attention, safe_denominator, softmax_attention


def rand_inputs(n, m=6, dv=5, b=2, h=3, signed=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(b, h, n, m, generator=gen)
    g = torch.randn(b, h, n, m, generator=gen)
    if not signed:
        f, g = f.abs() + 0.1, g.abs() + 0.1
    v = torch.randn(b, h, n, dv, generator=gen)
    return f, g, v


def rand_log_decay(f, seed=3, low=0.05, high=1.0):
    """Log-decays in [−high, −low] of shape ``f.shape[:-1]``, in ``f``'s dtype."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(f.shape[:-1], generator=gen, dtype=f.dtype)
    return -(low + (high - low) * u)


def naive_gated(f, g, v, log_decay, normalize):
    """``S_t = α_t S_{t−1} + g_t v_tᵀ``, ``y_t = S_tᵀ f_t / (f_t·z_t)`` with
    ``z_t = α_t z_{t−1} + g_t``, one (batch, head) and one token at a time."""
    out = torch.empty_like(v)
    for b, h in np.ndindex(*f.shape[:2]):
        state = torch.zeros(f.shape[-1], v.shape[-1], dtype=f.dtype)
        z = torch.zeros(f.shape[-1], dtype=f.dtype)
        for t in range(f.shape[2]):
            alpha = torch.exp(log_decay[b, h, t])
            state = alpha * state + torch.outer(g[b, h, t], v[b, h, t])
            z = alpha * z + g[b, h, t]
            y = state.T @ f[b, h, t]
            out[b, h, t] = y / (f[b, h, t] @ z) if normalize else y
    return out


@pytest.mark.parametrize("n", [1, 7, 16, 33, 64])
@pytest.mark.parametrize("normalize", [True, False, "abs"])
def test_three_forms_agree(n, normalize):
    f, g, v = rand_inputs(n)
    ref = linear_attention(f, g, v, mode="quadratic", normalize=normalize)
    rec = linear_attention(f, g, v, mode="recurrent", normalize=normalize)
    for chunk in (1, 4, 8, 16, 100):  # multiples of the chunk and not
        chk = linear_attention(f, g, v, mode="chunked", chunk_size=chunk, normalize=normalize)
        torch.testing.assert_close(chk, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rec, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("normalize", [False, "signed"])
def test_chunked_gradients_match_quadratic(normalize):
    # signed features only without a denominator: near-zero denominators amplify rounding
    f, g, v = (t.requires_grad_() for t in rand_inputs(37, signed=not normalize, seed=1))
    dy = torch.randn(2, 3, 37, 5)
    grads = {}
    for mode, chunk in (("quadratic", 64), ("chunked", 4), ("chunked", 16)):
        out = linear_attention(f, g, v, mode=mode, chunk_size=chunk, normalize=normalize)
        grads[mode, chunk] = torch.autograd.grad(out, (f, g, v), dy)
    for key in (("chunked", 4), ("chunked", 16)):
        for got, want in zip(grads[key], grads["quadratic", 64]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_matches_explicit_definition():
    f, g, v = rand_inputs(9, b=1, h=1)
    out = linear_attention(f, g, v, mode="chunked", chunk_size=4)
    for i in range(9):
        w = f[0, 0, i] @ g[0, 0, : i + 1].T
        torch.testing.assert_close(out[0, 0, i], w @ v[0, 0, : i + 1] / w.sum(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("mode", ["quadratic", "recurrent", "chunked"])
def test_causality_gradient_zero_for_future(mode, gated):
    n = 10
    f, g, v = (t.requires_grad_() for t in rand_inputs(n, b=1, h=1, signed=True))
    inputs = [f, g, v]
    log_decay = None
    if gated:
        log_decay = rand_log_decay(f).requires_grad_()
        inputs.append(log_decay)
    out = linear_attention(f, g, v, mode=mode, chunk_size=4, log_decay=log_decay)
    i = 4
    out[0, 0, i].sum().backward()
    for t in inputs:
        assert torch.all(t.grad[0, 0, i + 1:] == 0)
        assert t.grad[0, 0, : i + 1].abs().sum() > 0


@pytest.mark.parametrize("n", [1, 7, 16, 33])
@pytest.mark.parametrize("normalize", [False, True])
def test_gated_forms_match_the_definition_in_float64(n, normalize):
    f, g, v = (t.double() for t in rand_inputs(n, seed=n))
    log_decay = rand_log_decay(f)
    want = naive_gated(f, g, v, log_decay, normalize)
    kw = dict(normalize=normalize, log_decay=log_decay)
    for mode in ("quadratic", "recurrent"):
        assert (linear_attention(f, g, v, mode=mode, **kw) - want).abs().max() <= 1e-10
    for chunk in (1, 4, 8, 16, 100):  # multiples of the chunk and not
        got = linear_attention(f, g, v, mode="chunked", chunk_size=chunk, **kw)
        assert got.dtype == torch.float64
        assert (got - want).abs().max() <= 1e-10


@pytest.mark.parametrize("mode", ["quadratic", "recurrent", "chunked"])
def test_zero_log_decay_is_ungated(mode):
    f, g, v = rand_inputs(21)
    zeros = torch.zeros(f.shape[:-1])
    torch.testing.assert_close(
        linear_attention(f, g, v, mode=mode, chunk_size=8, log_decay=zeros),
        linear_attention(f, g, v, mode=mode, chunk_size=8), rtol=1e-6, atol=1e-6)


def test_strong_decay_stays_finite_and_forgets():
    # exp(b_i − b_j) for j > i would be exp(+∞)-sized here; the chunked form never forms it
    f, g, v = rand_inputs(256, b=1, h=2, signed=True)
    log_decay = torch.full(f.shape[:-1], -40.0)
    out = linear_attention(f, g, v, chunk_size=64, normalize=False, log_decay=log_decay)
    assert torch.isfinite(out).all()
    # α ≈ e^-40: each output is its own token's term only
    own = (f * g).sum(-1, keepdim=True) * v
    torch.testing.assert_close(out, own, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,chunk", [(10, 4), (8, 8)])
def test_chunked_gated_gradcheck(n, chunk):
    f, g, v = (t.double() for t in rand_inputs(n, m=3, dv=2, b=1, h=2, signed=True, seed=n))
    log_decay = rand_log_decay(f, low=0.1)  # stays < 0 under gradcheck's perturbations
    args = [t.requires_grad_() for t in (f, g, v, log_decay)]

    def fn(f, g, v, log_decay):
        return linear_attention(f, g, v, chunk_size=chunk, normalize=False, log_decay=log_decay)

    assert torch.autograd.gradcheck(fn, args)


def test_no_nan_inf_with_signed_p6_features_long_sequence():
    from arbench.featuremaps import LLoPS

    torch.manual_seed(0)
    fm_q, fm_k = LLoPS(16, m=32, p=6), LLoPS(16, m=32, p=6)
    x = torch.randn(1, 2, 4096, 16)
    f, g = fm_q(x), fm_k(torch.randn_like(x))
    assert (f < 0).any() and (g < 0).any()
    v = torch.randn(1, 2, 4096, 8)
    for normalize in (True, "abs", False):
        out = linear_attention(f, g, v, normalize=normalize, chunk_size=64)
        assert torch.isfinite(out).all()


def test_safe_denominator_keeps_sign_and_distance():
    den = torch.tensor([-2.0, -1e-9, 0.0, 1e-9, 3.0])
    torch.testing.assert_close(safe_denominator(den, 1e-3, "signed"),
                               torch.tensor([-2.0, -1e-3, 1e-3, 1e-3, 3.0]))
    torch.testing.assert_close(safe_denominator(den, 1e-3, "abs"),
                               torch.tensor([2.0, 1e-3, 1e-3, 1e-3, 3.0]))


def test_half_precision_accumulates_in_float32():
    f, g, v = rand_inputs(40)
    ref = linear_attention(f, g, v)
    out = linear_attention(f.bfloat16(), g.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)


def test_errors():
    f, g, v = rand_inputs(8)
    with pytest.raises(ValueError, match="mode must be one of"):
        linear_attention(f, g, v, mode="fast")
    with pytest.raises(ValueError, match="normalize must be"):
        linear_attention(f, g, v, normalize="maybe")
    with pytest.raises(ValueError, match="shape mismatch"):
        linear_attention(f, g[..., :3], v)
    with pytest.raises(ValueError, match="chunk_size must be"):
        linear_attention(f, g, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"log_decay must have shape \(batch, heads, seq\)"):
        linear_attention(f, g, v, log_decay=torch.zeros(2, 3))
    for bad in (0.5, float("inf"), float("-inf")):
        log_decay = torch.zeros(f.shape[:-1])
        log_decay[0, 1, 2] = bad
        with pytest.raises(ValueError, match="log_decay must be finite and <= 0"):
            linear_attention(f, g, v, log_decay=log_decay)


def test_nan_log_decay_propagates_for_the_divergence_guard():
    f, g, v = rand_inputs(8)
    log_decay = torch.zeros(f.shape[:-1])
    log_decay[0, 1, 2] = float("nan")
    out = linear_attention(f, g, v, log_decay=log_decay, chunk_size=4)
    assert out[0, 1, 2:].isnan().all() and not out[0, 1, :2].isnan().any()


def test_softmax_attention_is_causal_softmax():
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    out = softmax_attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, scores.softmax(-1) @ v)
