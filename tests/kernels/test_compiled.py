"""The compiled CP product (arbench.kernels.compiled) against its reference
(arbench.naive.naive_cp_product): value and gradient, on a CPU (torch.compile's C++ backend)
and on a GPU; where it runs (CUDA only, by the one rule)."""

from __future__ import annotations

import pytest
import torch

from arbench import featuremaps
from arbench.featuremaps import LLoPS, PolySketch, cp_weights
from arbench.kernels.compiled import compiled_cp_product
from arbench.naive import naive_cp_product
from arbench.precision import cpu_kernels


def case(device: str, dtype: torch.dtype = torch.float32, n: int = 37, p: int = 3,
         rank: int = 2, bias: bool = True):
    gen = torch.Generator().manual_seed(p * 10 + rank)
    theta = torch.randn(rank, p, 8, 6, generator=gen) * 0.5
    b = torch.randn(rank, p, 6, generator=gen) if bias else None
    w, wb = cp_weights(theta, b)
    x = torch.randn(2, n, 8, generator=gen)
    leaves = [t.to(device, dtype).requires_grad_() for t in (x, w, *([wb] if bias else []))]
    return leaves, p, rank


def value_and_grads(fn, leaves, p, rank):
    out = fn(leaves[0], leaves[1], p, rank, leaves[2] if len(leaves) > 2 else None)
    dy = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out).to(out.dtype)
    return out, torch.autograd.grad(out, leaves, dy)


def test_compiled_equals_reference_on_cpu():
    for n in (37, 53):  # a second length: dynamic shapes
        leaves, p, rank = case("cpu", n=n)
        want, want_grads = value_and_grads(naive_cp_product, leaves, p, rank)
        got, got_grads = value_and_grads(compiled_cp_product, leaves, p, rank)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_path_runs_on_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(featuremaps, "compiled_cp_product",
                        lambda *a, **k: calls.append(1) or naive_cp_product(*a, **k))
    LLoPS(8, m=6, p=3)(torch.randn(2, 5, 8))
    assert not calls, "the compiled product ran on a CPU tensor"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the compiled CP product is its path)")

CUDA_TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}
"""(rtol, atol) of compiled against eager on CUDA: fp32 computes the same products (inductor may
fuse them in another order); under bf16 autocast inductor keeps the products in fp32 where
eager rounds each one to bf16."""


@needs_cuda
@pytest.mark.parametrize("make", [lambda: LLoPS(16, m=32, p=4, rank=2, affine=True),
                                  lambda: PolySketch(16, m=32, p=4)], ids=["llops", "polysketch"])
@pytest.mark.parametrize("dtype", list(CUDA_TOLERANCES), ids=["fp32", "bf16"])
def test_cuda_feature_maps_take_the_compiled_product(monkeypatch, make, dtype):
    calls = []
    real = featuremaps.compiled_cp_product
    monkeypatch.setattr(featuremaps, "compiled_cp_product",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    fmap = make().cuda()
    if isinstance(fmap, LLoPS):
        with torch.no_grad():
            fmap.bias.normal_()
    x = torch.randn(2, 3, 100, 16, device="cuda", requires_grad=True)
    bf16 = dtype == torch.bfloat16
    outs = []
    for kernels_on in (True, False):
        with cpu_kernels(kernels_on), torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            out = fmap(x)
        grads = torch.autograd.grad(out.float().pow(2).sum(), [x, *fmap.parameters()])
        outs.append((out.float(), grads))
    assert len(calls) == 1, "the compiled product did not run (or ran with kernels off)"
    rtol, atol = CUDA_TOLERANCES[dtype]
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=rtol, atol=atol)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=rtol * 10, atol=atol * 10)
