"""One rule decides where the kernels run (arbench.precision.use_cpu_kernels): every site takes
the kernel on a CPU and the reference form when the kernels are switched off, with the same
value and gradient; and the malloc setting."""

import os
import subprocess
import sys
from functools import partial

import pytest
import torch

from arbench import kernels
from arbench.attention import linear_attention
from arbench.featuremaps import Based, Flatten, LLoPS, PolySketch
from arbench.mixers import ShortConv
from arbench.precision import cpu_kernels, use_cpu_kernels

SITES = [
    ("cp_product", partial(LLoPS, 8, m=6, p=3, rank=2)),
    ("cp_product", partial(PolySketch, 8, m=6, p=3)),
    ("projected_power", partial(Flatten, 8, m=6, p=4)),
    ("taylor_features", partial(Based, 8, r=3)),
    ("causal_conv", partial(ShortConv, 8)),
    ("chunked_attention", lambda: lambda x: linear_attention(x.abs(), x.abs(), x, chunk_size=4)),
]


@pytest.mark.parametrize("kernel,make", SITES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SITES)])
def test_every_site_follows_the_rule(monkeypatch, kernel, make):
    torch.manual_seed(0)
    module = make()
    calls = []
    real = getattr(kernels, kernel)
    monkeypatch.setattr(kernels, kernel, lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(2, 10, 8, requires_grad=True)
    fast = module(x)
    assert calls, f"{kernel} did not run on a CPU tensor"
    (fast_grad,) = torch.autograd.grad(fast.pow(2).sum(), x)
    calls.clear()
    with cpu_kernels(False):
        assert not use_cpu_kernels(x)
        plain = module(x)
    assert not calls, f"{kernel} ran with the kernels switched off"
    (plain_grad,) = torch.autograd.grad(plain.pow(2).sum(), x)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_grad, plain_grad, rtol=1e-4, atol=1e-4)
    assert use_cpu_kernels(x) and not use_cpu_kernels(x.to("meta"))


@pytest.mark.parametrize("env,want", [("system", "False"), ("", "True")])
def test_keep_heap_obeys_arbench_malloc(env, want):
    if not sys.platform.startswith("linux") and want == "True":
        pytest.skip("glibc malloc only")
    code = "from arbench.kernels import keep_heap; print(keep_heap(), keep_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "ARBENCH_MALLOC": env},
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.split() == [want, want]
