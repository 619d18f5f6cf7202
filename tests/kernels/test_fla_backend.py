"""fla as the CUDA backend of the attention forms (arbench.kernels.fla_backend).

On a CPU: every convention mapping (layout, scale, gate, β, q/k normalisation, state, odd
widths, the denominator) through a plain-torch model of fla's documented recurrence
(tests/kernels/fla_model.py) against arbench's own reference forms; the dtype and width
routing; the fallback when fla does not import. On a GPU with fla installed: fla's kernels
against that model and against arbench's references, forward and gradients, with the
tolerances of :data:`TOLERANCES`.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from fla_model import MODEL_OPS, recurrence

from arbench.attention import linear_attention
from arbench.delta import delta_attention
from arbench.kernels import fla_backend
from arbench.kernels.fla_backend import (
    DELTA_MAX_WIDTH,
    fla_delta,
    fla_dtype,
    fla_linear,
    from_fla,
    pad_even,
    skip_reason,
    to_fla,
)
from arbench.precision import cpu_kernels

FORMS = fla_backend.FORMS


def inputs(form: str, m: int = 5, dv: int = 3, n: int = 11, dtype=torch.float64,
           device: str = "cpu", seed: int = 0, norm: float = 1.0) -> dict:
    """f, g ``(2, 3, n, m)``, v ``(2, 3, n, dv)`` and, per form, β and a log-decay (float32).
    The delta rules get features of L2 norm ``norm`` (the mixers give them unit features)."""
    gen = torch.Generator().manual_seed(seed)
    b, h = 2, 3
    f, g = (torch.randn(b, h, n, m, generator=gen, dtype=torch.float64) for _ in range(2))
    if form in ("delta", "gated_delta"):
        f, g = norm * F.normalize(f, dim=-1), norm * F.normalize(g, dim=-1)
    out = {"f": f, "g": g, "v": torch.randn(b, h, n, dv, generator=gen, dtype=torch.float64)}
    if form in ("delta", "gated_delta"):
        out["beta"] = torch.rand(b, h, n, generator=gen, dtype=torch.float64)
    if form in ("gated", "gated_delta"):
        out["log_decay"] = -0.5 * torch.rand(b, h, n, generator=gen, dtype=torch.float64)
    return {k: t.to(device, dtype if k not in ("log_decay",) else torch.float32)
            .requires_grad_() for k, t in out.items()}


def arbench_reference(form: str, x: dict, **kw) -> torch.Tensor:
    """arbench's definition (token by token), no denominator."""
    if form in ("linear", "gated"):
        return linear_attention(x["f"], x["g"], x["v"], mode="recurrent", normalize=False,
                                log_decay=x.get("log_decay"), **kw)
    return delta_attention(x["f"], x["g"], x["v"], x["beta"], log_decay=x.get("log_decay"),
                           mode="recurrent")


def through_fla(form: str, x: dict, ops) -> torch.Tensor:
    """The backend's mapping onto fla, with ``ops`` (fla's kernels or the model)."""
    if form in ("linear", "gated"):
        return fla_linear(x["f"], x["g"], x["v"], x.get("log_decay"), ops=ops)
    return fla_delta(x["f"], x["g"], x["v"], x["beta"], x.get("log_decay"), ops=ops)


def grads(out: torch.Tensor, x: dict, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device, out.dtype)
    return list(torch.autograd.grad(out, list(x.values()), dy))


# ---- the mapping, on a CPU --------------------------------------------------------------------

def test_layout_round_trip():
    x = torch.randn(2, 3, 7, 5)
    assert to_fla(x).shape == (2, 7, 3, 5) and to_fla(x).is_contiguous()
    torch.testing.assert_close(to_fla(x)[1, 4, 2], x[1, 2, 4], rtol=0, atol=0)
    torch.testing.assert_close(from_fla(to_fla(x)), x, rtol=0, atol=0)
    s = torch.randn(2, 3, 7)
    assert to_fla(s).shape == (2, 7, 3) and to_fla(s)[0, 5, 1] == s[0, 1, 5]


def test_pad_even_adds_one_zero_column_to_odd_widths_only():
    odd, even = torch.randn(2, 5), torch.randn(2, 4)
    assert pad_even(odd).shape == (2, 6) and bool((pad_even(odd)[:, -1] == 0).all())
    torch.testing.assert_close(pad_even(odd)[:, :5], odd, rtol=0, atol=0)
    assert pad_even(even) is even


@pytest.mark.parametrize("form", FORMS)
def test_mapped_inputs_through_fla_recurrence_equal_arbench(form):
    """Layout, scale 1, the gate's log form and sign, β, no in-kernel L2 norm, zero state and
    the odd-width padding together: value and gradient equal arbench's definition."""
    x = inputs(form)
    want = arbench_reference(form, x)
    got = through_fla(form, x, MODEL_OPS)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads(got, x), grads(want, x)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("form", FORMS)
def test_bf16_odd_widths_reach_fla_even(form):
    """16-bit fla kernels need even K and V (the model asserts it as fla's backward does): odd
    widths are padded, and the padded call still equals arbench's form on the same values."""
    x = inputs(form, m=7, dv=5, dtype=torch.bfloat16)
    got = through_fla(form, x, MODEL_OPS).float()
    exact = {k: t.detach().double() for k, t in x.items()}
    want = arbench_reference(form, exact).float()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def conventions_broken(form: str, x: dict) -> dict[str, torch.Tensor]:
    """The model called with each of arbench's conventions left out, one at a time."""
    q, k, v = (to_fla(x[name].detach()) for name in ("f", "g", "v"))
    beta = to_fla(x["beta"].detach()) if "beta" in x else None
    gate = to_fla(x["log_decay"].detach().double()) if "log_decay" in x else None
    out = {"fla's default scale K^-1/2": recurrence(q, k, v, gate, beta, None, None, False, False)[0],
           "q/k L2-normalised in the kernel": recurrence(q, k, v, gate, beta, 1.0, None, False,
                                                         True)[0],
           "a non-zero initial state": recurrence(q, k, v, gate, beta, 1.0,
                                                  torch.ones(2, 3, q.shape[-1], v.shape[-1],
                                                             dtype=q.dtype), False, False)[0]}
    if gate is not None:
        out["the gate's sign flipped"] = recurrence(q, k, v, -gate, beta, 1.0, None, False, False)[0]
        out["the gate as a decay, not its log"] = recurrence(q, k, v, gate.exp(), beta, 1.0, None,
                                                             False, False)[0]
    return out


@pytest.mark.parametrize("form", FORMS)
def test_every_convention_matters(form):
    """The comparison above can fail: each convention mapped differently changes the output."""
    x = inputs(form, norm=0.8)  # not unit: an in-kernel L2 norm would change the features
    want = arbench_reference(form, x).detach()
    torch.testing.assert_close(through_fla(form, x, MODEL_OPS), want, rtol=1e-10, atol=1e-12)
    for name, got in conventions_broken(form, x).items():
        assert not torch.allclose(from_fla(got), want, rtol=1e-3, atol=1e-3), name


@pytest.fixture
def fla_as_model(monkeypatch):
    """fla 'installed' as the model, and CPU float64 calls routed to it: the wiring of
    linear_attention and delta_attention, checked on a CPU. Counts the calls."""
    calls = []

    def counted(fn):
        return lambda *a, **k: calls.append(fn.__name__) or fn(*a, **k)

    ops = fla_backend.FlaOps(counted(MODEL_OPS.simple_gla), counted(MODEL_OPS.delta_rule),
                             counted(MODEL_OPS.gated_delta_rule), "model")
    monkeypatch.setattr(fla_backend, "fla_ops", lambda: ops)
    monkeypatch.setattr(fla_backend, "fla_dtype", lambda form, f, *t: torch.float64)
    return calls


@pytest.mark.parametrize("normalize", ["signed", "abs", "none"])
@pytest.mark.parametrize("form", ["linear", "gated"])
def test_linear_attention_sends_the_chunked_form_to_fla(fla_as_model, form, normalize):
    """The denominator ([v, 1] column, safe_denominator in fp32) is arbench's on the fla path."""
    x = inputs(form)
    kw = {"normalize": normalize, "log_decay": x.get("log_decay")}
    got = linear_attention(x["f"], x["g"], x["v"], mode="chunked", **kw)
    assert fla_as_model == ["simple_gla"]
    want = linear_attention(x["f"], x["g"], x["v"], mode="quadratic", **kw)
    assert fla_as_model == ["simple_gla"], "only the chunked form goes to fla"
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    for a, b in zip(grads(got, x), grads(want, x)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("form", ["delta", "gated_delta"])
def test_delta_attention_sends_the_chunked_form_to_fla(fla_as_model, form):
    x = inputs(form, n=70)
    got = delta_attention(x["f"], x["g"], x["v"], x["beta"], log_decay=x.get("log_decay"))
    assert fla_as_model == [f"{form}_rule"]
    want = arbench_reference(form, x)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    for a, b in zip(grads(got, x), grads(want, x)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


# ---- routing and fallback ---------------------------------------------------------------------

@pytest.fixture
def fla_installed(monkeypatch):
    """fla importable (as the model), whatever this machine has."""
    monkeypatch.setattr(fla_backend, "_load", lambda: (MODEL_OPS, ""))


@pytest.mark.parametrize("form", FORMS)
def test_dtype_routing(fla_installed, form):
    for dtype in (torch.bfloat16, torch.float16):
        assert skip_reason(form, dtype, 64) == ""
    for dtype in (torch.float32, torch.float64):
        assert str(dtype) in skip_reason(form, dtype, 64)
    wide = skip_reason(form, torch.bfloat16, DELTA_MAX_WIDTH + 17)
    if form in ("delta", "gated_delta"):
        assert str(DELTA_MAX_WIDTH) in wide  # BASED's 273 features: arbench's delta form
    else:
        assert wide == ""
    assert skip_reason(form, torch.bfloat16, DELTA_MAX_WIDTH) == ""
    with pytest.raises(ValueError, match="form must be one of"):
        skip_reason("softmax", torch.bfloat16, 64)


def test_cpu_calls_never_reach_fla(fla_installed, monkeypatch):
    """On a CPU the CPU kernels / references run, also in 16-bit and with fla installed."""
    def boom(*a, **k):
        raise AssertionError("fla called for a CPU tensor")
    monkeypatch.setattr(fla_backend, "fla_linear", boom)
    monkeypatch.setattr(fla_backend, "fla_delta", boom)
    for form in FORMS:
        x = {k: t.detach().to(torch.bfloat16) for k, t in inputs(form, n=9).items()}
        assert fla_dtype(form, x["f"], x["g"], x["v"]) is None
        if form in ("linear", "gated"):
            linear_attention(x["f"], x["g"], x["v"], log_decay=x.get("log_decay"))
        else:
            delta_attention(x["f"], x["g"], x["v"], x["beta"].float(),
                            log_decay=x.get("log_decay"))


def test_import_failure_falls_back_to_arbench(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # `import fla` raises ImportError
    fla_backend._load.cache_clear()
    try:
        assert fla_backend.fla_ops() is None
        reason = fla_backend.unavailable_reason()
        assert reason.startswith("fla not importable (") and "\n" not in reason
        assert skip_reason("linear", torch.bfloat16, 64) == reason
        assert fla_backend.backend_name("linear", "cuda", torch.bfloat16, 64) == "arbench"
    finally:
        fla_backend._load.cache_clear()


def test_backend_name(fla_installed):
    assert fla_backend.backend_name("delta", "cuda", torch.bfloat16, 64) == "fla model"
    assert fla_backend.backend_name("delta", "cuda", torch.float32, 64) == "arbench"
    assert fla_backend.backend_name("delta", "cpu", torch.bfloat16, 64) == "arbench"


# ---- on a GPU: fla's kernels ------------------------------------------------------------------

def _gpu_skip() -> str:
    if not torch.cuda.is_available():
        return ("needs a CUDA GPU: fla's Triton kernels do not run on a CPU (under "
                "TRITON_INTERPRET=1 they stop with '0 active drivers')")
    return fla_backend.unavailable_reason() and (
        f"{fla_backend.unavailable_reason()}: pip install -r requirements-gpu.txt")


needs_fla_gpu = pytest.mark.skipif(bool(_gpu_skip()), reason=_gpu_skip() or "runs")

TOLERANCES = {torch.bfloat16: {"fwd": 2e-2, "grad": 4e-2},
              torch.float16: {"fwd": 5e-3, "grad": 1e-2}}
"""Relative RMS error ‖fla − reference‖₂ / ‖reference‖₂ allowed per compute dtype, for the
output and for each input's gradient (fla's own tests compare its kernels by this measure).
Both sides see the same 16-bit inputs; the reference computes in fp32 (the model in float64),
fla keeps 16-bit operands and per-chunk states between its kernels: about 2^-8 relative for
bf16, 2^-11 for fp16, grown by the sums over a few hundred tokens."""


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative RMS error of ``got`` against ``want`` (computed in float64)."""
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


GPU_CASES = [(form, dtype) for form in FORMS for dtype in TOLERANCES]
GPU_IDS = [f"{form}-{str(dtype).removeprefix('torch.')}" for form, dtype in GPU_CASES]


@needs_fla_gpu
@pytest.mark.parametrize("form,dtype", GPU_CASES, ids=GPU_IDS)
def test_cuda_fla_kernels_follow_the_model(form, dtype):
    """fla's kernels compute the recurrence the CPU tests assume (forward)."""
    x = inputs(form, m=64, dv=32, n=200, dtype=dtype, device="cuda")
    got = through_fla(form, x, fla_backend.fla_ops())
    want = through_fla(form, {k: t.detach().cpu() for k, t in x.items()}, MODEL_OPS)
    assert rel_err(got.cpu(), want) <= TOLERANCES[dtype]["fwd"]


@needs_fla_gpu
@pytest.mark.parametrize("form,dtype", GPU_CASES, ids=GPU_IDS)
def test_cuda_fla_path_matches_arbench_reference(form, dtype, monkeypatch):
    """The chunked form on CUDA in 16-bit goes to fla and equals arbench's fp32 form on the
    same inputs (kernels switched off), forward and every input's gradient. Odd widths."""
    calls = []
    real = fla_backend.fla_linear if form in ("linear", "gated") else fla_backend.fla_delta
    name = real.__name__
    monkeypatch.setattr(fla_backend, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    x = inputs(form, m=65, dv=33, n=300, dtype=dtype, device="cuda")
    got = _call(form, x)
    assert calls, f"{form} in {dtype} on CUDA did not run fla"
    with cpu_kernels(False):
        ref_x = {k: t.detach().float().requires_grad_() for k, t in x.items()}
        want = _call(form, ref_x)
    assert len(calls) == 1
    tol = TOLERANCES[dtype]
    assert rel_err(got, want) <= tol["fwd"]
    for key, a, b in zip(x, grads(got, x), grads(want, ref_x)):
        assert rel_err(a, b) <= tol["grad"], key


def _call(form: str, x: dict) -> torch.Tensor:
    if form in ("linear", "gated"):
        return linear_attention(x["f"], x["g"], x["v"], normalize=False,
                                log_decay=x.get("log_decay"))
    return delta_attention(x["f"], x["g"], x["v"], x["beta"], log_decay=x.get("log_decay"))


@needs_fla_gpu
def test_cuda_autocast_routes_fp32_inputs_to_fla_in_bf16(monkeypatch):
    """Under bf16 autocast (``--trainer.precision bf16-mixed``) the delta rule's fp32 inputs
    (F.normalize runs in fp32 under autocast) compute in bf16 through fla."""
    calls = []
    real = fla_backend.fla_delta
    monkeypatch.setattr(fla_backend, "fla_delta",
                        lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    x = {k: t.detach() for k, t in inputs("delta", m=64, dv=32, n=128, dtype=torch.float32,
                                           device="cuda").items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = delta_attention(x["f"], x["g"], x["v"], x["beta"])
    assert calls == [torch.bfloat16] and out.dtype == torch.float32
    with cpu_kernels(False):
        want = delta_attention(x["f"], x["g"], x["v"], x["beta"])
    assert rel_err(out, want) <= TOLERANCES[torch.bfloat16]["fwd"]
