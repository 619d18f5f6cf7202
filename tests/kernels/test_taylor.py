"""BASED's one-buffer Taylor writer against arbench.naive.naive_taylor_features."""

import pytest
import torch

from arbench import kernels
from arbench.kernels.taylor import TaylorFeatures
from arbench.naive import naive_taylor_features


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_taylor_kernel_equals_the_reference(dtype):
    torch.manual_seed(0)
    xt = torch.randn(2, 5, 7, dtype=dtype, requires_grad=True)[..., 1:4]  # strided, r = 3
    a, b = 3 ** -0.25, 6 ** -0.5
    want = naive_taylor_features(xt, a, b)
    assert want.shape == (2, 5, 1 + 3 + 9)
    got = kernels.taylor_features(xt, a, b)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        torch.testing.assert_close(kernels.taylor_features(xt, a, b), want)
    dy = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, xt, dy), torch.autograd.grad(want, xt, dy))


def test_taylor_backward_is_the_exact_gradient():
    xt = torch.randn(9, 3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: TaylorFeatures.apply(t, 0.7, -1.3), (xt,))
