"""The compiled elementwise chains (arbench.kernels.fused) against the eager kernels: the CP
product bit for bit in fp32 and float64, the convolution against its reference in bf16, fp32
never fused for the convolution, and the fallbacks (a failing compile, a dispatch mode)."""

import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from arbench import kernels
from arbench.kernels import fused
from arbench.kernels.fused import fused_kernels
from arbench.mixers import ShortConv
from arbench.naive import naive_causal_conv


@pytest.fixture
def always_fused(monkeypatch):
    """Every size runs the compiled forms (the default keeps small tensors eager)."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 1)


def cp_run(x, w, b, p, rank, dy, on: bool, bf16: bool = False):
    """Output and gradients of the blocked CP product (blocks of 4 rows), fused or eager."""
    with fused_kernels(on), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = kernels.cp_product(x, w, p, rank, b, rows=4)
    return (out, *torch.autograd.grad(out, (x, w, b), dy.to(out.dtype)))


@pytest.mark.parametrize("p,rank,dtype", [(2, 1, torch.float32), (3, 2, torch.float32),
                                          (4, 1, torch.float32), (6, 3, torch.float32),
                                          (3, 2, torch.float64)])
def test_cp_product_fused_is_bit_identical_to_eager(always_fused, p, rank, dtype):
    # 10 rows in blocks of 4: two full blocks (static graph) and a short one (dynamic)
    torch.manual_seed(p * 10 + rank)
    x = torch.randn(10, 8, dtype=dtype, requires_grad=True)
    w = (torch.randn(8, p * rank * 5, dtype=dtype) / 3).requires_grad_()
    b = torch.randn(p * rank * 5, dtype=dtype, requires_grad=True)
    dy = torch.randn(10, 5, dtype=dtype)
    got, want = cp_run(x, w, b, p, rank, dy, True), cp_run(x, w, b, p, rank, dy, False)
    for a, e in zip(got, want, strict=True):
        assert a.dtype == e.dtype
        assert torch.equal(a, e)


def test_cp_product_fused_bf16_is_as_close_to_fp32_as_eager(always_fused):
    # the compiled chain rounds once per output, the eager one after every multiplication
    torch.manual_seed(0)
    p, rank = 4, 2
    x = torch.randn(64, 16, requires_grad=True)
    w = (torch.randn(16, p * rank * 32) / 4).requires_grad_()
    b = torch.randn(p * rank * 32, requires_grad=True)
    dy = torch.randn(64, 32)
    ref = cp_run(x, w, b, p, rank, dy, False)
    fused_out, eager_out = (cp_run(x, w, b, p, rank, dy, on, bf16=True) for on in (True, False))
    for f, e, r in zip(fused_out, eager_out, ref, strict=True):
        assert f.dtype == e.dtype
        err_f, err_e = ((t.double() - r.double()).abs().mean() for t in (f, e))
        assert err_f <= 1.05 * err_e
        torch.testing.assert_close(f.float(), r, rtol=0.05, atol=0.05 * r.abs().max().item())


@pytest.mark.parametrize("k,n", [(3, 7), (4, 9), (3, 2), (3, 1)])
def test_conv_fused_bf16_matches_the_reference(always_fused, k, n):
    torch.manual_seed(k * 10 + n)
    mixer = ShortConv(16, kernel_size=k)
    h = torch.randn(3, n, 16, requires_grad=True)
    weight, bias = mixer.conv.weight, mixer.conv.bias
    dy = torch.randn(3, n, 16)
    want = naive_causal_conv(h.double(), mixer.double().conv)
    grads_want = torch.autograd.grad(want, (h, weight, bias), dy.double())
    mixer.float()
    results = {}
    for on in (True, False):
        with fused_kernels(on), torch.autocast("cpu", dtype=torch.bfloat16):
            got = kernels.causal_conv(h, weight, bias)
        assert got.dtype == torch.bfloat16
        results[on] = (got, *torch.autograd.grad(got, (h, weight, bias), dy.bfloat16()))
    for f, e, r in zip(results[True], results[False], (want, *grads_want), strict=True):
        assert f.dtype == e.dtype
        r = r.double()
        scale = r.abs().max().item()
        torch.testing.assert_close(f.double(), r, rtol=0.02, atol=0.02 * scale)
        err_f, err_e = ((t.double() - r).abs().mean() for t in (f, e))
        assert err_f <= 1.05 * err_e + 1e-6 * scale


def test_conv_in_fp32_never_runs_fused(always_fused, monkeypatch):
    def refuse(*args):
        raise AssertionError("fused in fp32")
    monkeypatch.setattr(kernels.conv, "fused_conv", refuse)
    monkeypatch.setattr(kernels.conv, "fused_conv_grad", refuse)
    h = torch.randn(2, 5, 4, requires_grad=True)
    out = kernels.causal_conv(h, torch.randn(4, 1, 3), torch.randn(4))
    out.sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(AssertionError):
        kernels.causal_conv(h, torch.randn(4, 1, 3), torch.randn(4))


def test_a_failing_compile_warns_once_and_runs_eagerly(always_fused, monkeypatch):
    monkeypatch.setattr(fused, "_BROKEN", [])

    def no_compiler(fn, **static):
        raise RuntimeError("no C++ compiler\nlong details")
    monkeypatch.setattr(fused, "_compiled", no_compiler)
    proj = torch.randn(6, 3 * 4)
    with pytest.warns(RuntimeWarning, match="fused kernels off .*no C\\+\\+ compiler"):
        got = fused.fused_product(proj, 3, 1)
    assert torch.equal(got, fused.product(proj, p=3, rank=1))
    assert not fused.use_fused(1 << 20)  # off for the process from now on


def test_dispatch_modes_see_the_eager_ops(always_fused):
    assert fused.use_fused(100)
    with FlopCounterMode(display=False):
        assert not fused.use_fused(100)
    with fused_kernels(False):
        assert not fused.use_fused(100)


def test_many_chains_and_shapes_stay_compiled(always_fused, monkeypatch):
    # every chain compiles through one wrapper frame of dynamo's, so its graphs share that
    # frame's recompile limits; a limit of 2 (as if a worker had built many graphs before)
    # is raised on the first compile, and the third graph below still compiles
    monkeypatch.setattr(fused, "_BROKEN", [])
    fused._compiled.cache_clear()
    with torch._dynamo.config.patch(recompile_limit=2, accumulated_recompile_limit=2), \
            warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for rank, rows in ((5, 6), (5, 7), (7, 6)):
            proj = torch.randn(rows, 2 * rank * 3)
            torch.testing.assert_close(fused.fused_product(proj, 2, rank),
                                       fused.product(proj, p=2, rank=rank))
        assert torch._dynamo.config.recompile_limit >= fused.RECOMPILE_LIMIT
    assert not fused._BROKEN
