import pytest
import torch

from arbench import attention
from arbench.attention import linear_attention, safe_denominator, softmax_attention


def rand_inputs(n, m=6, dv=5, b=2, h=3, signed=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(b, h, n, m, generator=gen)
    g = torch.randn(b, h, n, m, generator=gen)
    if not signed:
        f, g = f.abs() + 0.1, g.abs() + 0.1
    v = torch.randn(b, h, n, dv, generator=gen)
    return f, g, v


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


@pytest.mark.parametrize("reverse", [False, True])
def test_running_sum_over_chunks(reverse):
    x = torch.randn(2, 3, 6, 4, 5)
    want = x.flip(-3).cumsum(dim=-3).flip(-3) if reverse else x.cumsum(dim=-3)
    torch.testing.assert_close(attention._running_sum_(x.clone(), reverse=reverse), want)


@pytest.mark.parametrize("b,n,c", [(1, 24, 8), (3, 24, 8), (2, 8, 8), (1, 40, 4)])
def test_chunked_backward_is_the_exact_gradient(b, n, c):
    # float64 straight into the Function (linear_attention computes in float32)
    gen = torch.Generator().manual_seed(n + b)
    f, g = (torch.randn(b, n, 5, generator=gen, dtype=torch.double) for _ in range(2))
    v = torch.randn(b, n, 3, generator=gen, dtype=torch.double)
    args = [t.requires_grad_() for t in (f, g, v)]
    assert torch.autograd.gradcheck(lambda *t: attention._ChunkedAttention.apply(*t, c), args)
    with torch.no_grad():
        plain = attention._chunked_plain(f, g, v, c)
    torch.testing.assert_close(attention._ChunkedAttention.apply(f, g, v, c), plain)


def test_matches_explicit_definition():
    f, g, v = rand_inputs(9, b=1, h=1)
    out = linear_attention(f, g, v, mode="chunked", chunk_size=4)
    for i in range(9):
        w = f[0, 0, i] @ g[0, 0, : i + 1].T
        torch.testing.assert_close(out[0, 0, i], w @ v[0, 0, : i + 1] / w.sum(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("mode", ["quadratic", "recurrent", "chunked"])
def test_causality_gradient_zero_for_future(mode):
    n = 10
    f, g, v = (t.requires_grad_() for t in rand_inputs(n, b=1, h=1, signed=True))
    out = linear_attention(f, g, v, mode=mode, chunk_size=4)
    i = 4
    out[0, 0, i].sum().backward()
    for t in (f, g, v):
        assert torch.all(t.grad[0, 0, i + 1:] == 0)
        assert t.grad[0, 0, : i + 1].abs().sum() > 0


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


def test_softmax_attention_is_causal_softmax():
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    out = softmax_attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, scores.softmax(-1) @ v)
