"""The chunked attention Function and its running sums against arbench.attention.chunked_plain
(and, through it, the quadratic form)."""

import pytest
import torch

from arbench import kernels
from arbench.attention import chunked_plain
from arbench.kernels.chunked import ChunkedAttention, running_sum_


@pytest.mark.parametrize("reverse", [False, True])
def test_running_sum_over_chunks(reverse):
    x = torch.randn(2, 3, 6, 4, 5)
    want = x.flip(-3).cumsum(dim=-3).flip(-3) if reverse else x.cumsum(dim=-3)
    torch.testing.assert_close(running_sum_(x.clone(), reverse=reverse), want)


def inputs(b, n, m=5, dv=3, dtype=torch.double):
    gen = torch.Generator().manual_seed(n + b)
    f, g = (torch.randn(b, n, m, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(b, n, dv, generator=gen, dtype=dtype)
    return [t.requires_grad_() for t in (f, g, v)]


@pytest.mark.parametrize("b,n,c", [(1, 24, 8), (3, 24, 8), (2, 8, 8), (1, 40, 4)])
def test_chunked_kernel_equals_the_reference(b, n, c):
    f, g, v = inputs(b, n)
    want = chunked_plain(f, g, v, c)
    quadratic = (f @ g.transpose(-1, -2)).tril() @ v
    torch.testing.assert_close(want, quadratic)
    got = kernels.chunked_attention(f, g, v, c)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        torch.testing.assert_close(kernels.chunked_attention(f, g, v, c), want)
    dy = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (f, g, v), dy),
                               torch.autograd.grad(want, (f, g, v), dy))
    assert torch.autograd.gradcheck(lambda *t: ChunkedAttention.apply(*t, c), (f, g, v))


def test_chunked_kernel_on_leading_dims_float32():
    gen = torch.Generator().manual_seed(0)
    f, g = (torch.rand(2, 3, 32, 6, generator=gen) for _ in range(2))
    v = torch.randn(2, 3, 32, 4, generator=gen)
    torch.testing.assert_close(kernels.chunked_attention(f, g, v, 8), chunked_plain(f, g, v, 8))
