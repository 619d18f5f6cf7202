"""The attention output's RMSNorm in bf16 (arbench.kernels.norm) against its reference,
``nn.RMSNorm`` on the input in fp32: value and gradients, where it runs and where it does not."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from arbench.featuremaps import EluPlusOne
from arbench.kernels import fused, norm
from arbench.kernels.fused import fused_kernels
from arbench.mixers import LinearAttention


@pytest.fixture
def always_fused(monkeypatch):
    """Every size runs the compiled forms (the default keeps small tensors eager)."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 1)


def make_norm(d: int, eps: float | None = None, seed: int = 0) -> nn.RMSNorm:
    torch.manual_seed(seed)
    layer = nn.RMSNorm(d, eps=eps)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
    return layer


def run(fn, y: torch.Tensor, layer: nn.RMSNorm, dy: torch.Tensor):
    """Output, ∂y and ∂w of ``fn(y)`` for the output gradient ``dy``."""
    y = y.detach().requires_grad_()
    out = fn(y)
    grad_y, grad_w = torch.autograd.grad(out, (y, layer.weight), dy.to(out.dtype))
    return out, grad_y, grad_w


def test_the_chain_and_its_gradient_are_rmsnorm_in_fp32():
    # the uncompiled chain against autograd through nn.RMSNorm, both in fp32
    layer = make_norm(16, eps=1e-5)
    y, dy = torch.randn(3, 2, 7, 16), torch.randn(3, 2, 7, 16)
    want = run(layer, y, layer, dy)
    out, r = fused.rms_norm(y, layer.weight, 1e-5)
    grad_y, grad_w = fused.rms_norm_grad(dy, y, layer.weight, r)
    for got, ref in zip((out, grad_y, grad_w), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,eps", [((4, 2, 9, 32), None), ((2, 1, 64, 128), 1e-6),
                                       ((3, 5, 16), 1e-3)])
def test_bf16_kernel_is_as_close_to_the_fp64_reference_as_the_eager_form(always_fused, shape,
                                                                          eps):
    layer = make_norm(shape[-1], eps, seed=len(shape))
    y = (torch.randn(*shape) * 3).bfloat16()
    dy = torch.randn(*shape)
    ref_layer = make_norm(shape[-1], eps, seed=len(shape)).double()
    want = run(ref_layer, y.double(), ref_layer, dy.double())
    kernel = run(lambda t: norm.rms_norm_low(t, layer), y, layer, dy.bfloat16())
    eager = run(lambda t: layer(t.float()).bfloat16(), y, layer, dy.bfloat16())
    for k, e, r in zip(kernel, eager, want, strict=True):
        assert k.dtype == e.dtype
        scale = r.abs().max().item()
        torch.testing.assert_close(k.double(), r, rtol=0.02, atol=0.02 * scale)
        err_k, err_e = ((t.double() - r).abs().mean() for t in (k, e))
        assert err_k <= 1.05 * err_e + 1e-6 * scale


def test_eps_is_the_norms_or_fp32s_epsilon(always_fused):
    y = torch.full((1, 4, 8), 1e-3).bfloat16()  # mean(y²) = 1e-6, where eps matters
    for eps in (None, 1e-4):
        layer = make_norm(8, eps)
        want = layer(y.float())
        got = norm.rms_norm_low(y, layer)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=0.0)


def test_it_runs_only_for_low_precision_inputs_with_the_fused_kernels_on(always_fused):
    layer = make_norm(8)
    y = torch.randn(2, 3, 8)
    assert not norm.runs_low(y, layer)  # fp32 keeps nn.RMSNorm
    assert norm.runs_low(y.bfloat16(), layer)
    assert norm.runs_low(y.half(), layer)
    with fused_kernels(False):
        assert not norm.runs_low(y.bfloat16(), layer)
    with FlopCounterMode(display=False):
        assert not norm.runs_low(y.bfloat16(), layer)
    assert not norm.runs_low(y.bfloat16(), nn.RMSNorm(8, elementwise_affine=False))


def attention(seed: int = 0) -> LinearAttention:
    # elu + 1 features: no CP product, whose compiled graphs (one per shape and dtype under
    # always_fused) count towards dynamo's per-function recompile limit for the whole session
    torch.manual_seed(seed)
    return LinearAttention(32, 2, EluPlusOne, chunk_size=4)


def test_the_mixer_uses_it_under_bf16_autocast_and_not_in_fp32(always_fused, monkeypatch):
    calls = []
    real = norm.RMSNormLow.apply
    monkeypatch.setattr(norm.RMSNormLow, "apply", lambda *a: calls.append(1) or real(*a))
    mixer = attention()
    x = torch.randn(2, 10, 32)
    fp32 = mixer(x)
    assert not calls
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = mixer(x)
        with fused_kernels(False):
            eager = mixer(x)
    assert calls == [1]
    scale = fp32.abs().max().item()
    torch.testing.assert_close(low.float(), eager.float(), rtol=0.0, atol=0.02 * scale)
    torch.testing.assert_close(low.float(), fp32, rtol=0.0, atol=0.05 * scale)
