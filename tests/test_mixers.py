import pytest
import torch

from arbench.mixers import ShortConv, _CausalDepthwiseConv


def conv1d_reference(conv: ShortConv, h: torch.Tensor) -> torch.Tensor:
    """The transposed, left-padded ``nn.Conv1d`` the short convolution stands for."""
    return conv.conv(h.transpose(1, 2))[..., : h.shape[1]].transpose(1, 2)


@pytest.mark.parametrize("k,n", [(1, 5), (3, 7), (4, 9), (3, 2), (3, 1)])
def test_causal_depthwise_conv_matches_conv1d(k, n):
    torch.manual_seed(k * 10 + n)
    mixer = ShortConv(6, kernel_size=k).double()
    h = torch.randn(2, n, 6, dtype=torch.double, requires_grad=True)
    w, b = mixer.conv.weight[:, 0, :], mixer.conv.bias
    want = conv1d_reference(mixer, h)
    got = _CausalDepthwiseConv.apply(h, w, b)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.sum() + (got ** 2).sum(), (h, mixer.conv.weight, b))
    grads_want = torch.autograd.grad(want.sum() + (want ** 2).sum(), (h, mixer.conv.weight, b))
    for a, e in zip(grads, grads_want, strict=True):
        torch.testing.assert_close(a, e)
    assert torch.autograd.gradcheck(_CausalDepthwiseConv.apply, (h, w, b))


def test_short_conv_is_causal():
    torch.manual_seed(0)
    mixer = ShortConv(4)
    x = torch.randn(1, 8, 4)
    y = x.clone()
    y[:, 5:] += 1.0  # change the future only
    torch.testing.assert_close(mixer(x)[:, :5], mixer(y)[:, :5])
