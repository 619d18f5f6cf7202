"""The causal depthwise convolution kernel against arbench.naive.naive_causal_conv (nn.Conv1d)."""

import pytest
import torch

from arbench import kernels
from arbench.kernels.conv import CausalDepthwiseConv
from arbench.mixers import ShortConv
from arbench.naive import naive_causal_conv


@pytest.mark.parametrize("k,n", [(1, 5), (3, 7), (4, 9), (3, 2), (3, 1)])
def test_causal_conv_kernel_equals_the_reference(k, n):
    torch.manual_seed(k * 10 + n)
    mixer = ShortConv(6, kernel_size=k).double()
    h = torch.randn(2, n, 6, dtype=torch.double, requires_grad=True)
    weight, bias = mixer.conv.weight, mixer.conv.bias
    want = naive_causal_conv(h, mixer.conv)
    got = kernels.causal_conv(h, weight, bias)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        torch.testing.assert_close(kernels.causal_conv(h, weight, bias), want)
    grads = torch.autograd.grad(got.sum() + (got ** 2).sum(), (h, weight, bias))
    grads_want = torch.autograd.grad(want.sum() + (want ** 2).sum(), (h, weight, bias))
    for a, e in zip(grads, grads_want, strict=True):
        torch.testing.assert_close(a, e)
    assert torch.autograd.gradcheck(CausalDepthwiseConv.apply, (h, weight[:, 0, :], bias))


def test_reference_is_causal():
    mixer = ShortConv(4, kernel_size=3)
    h = torch.randn(1, 8, 4)
    later = h.clone()
    later[:, 5:] += 1.0
    torch.testing.assert_close(naive_causal_conv(h, mixer.conv)[:, :5],
                               naive_causal_conv(later, mixer.conv)[:, :5])
