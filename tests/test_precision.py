"""bf16 autocast on the CPU kernels: documented dtypes, parity with fp32, fp32 accumulators."""

from functools import partial

import pytest
import torch
from paths import SMOKE, config

from arbench import precision
from arbench.attention import linear_attention
from arbench.cli import run
from arbench.featuremaps import Based, Flatten, LLoPS, PolySketch
from arbench.mixers import ShortConv
from arbench.model import RecallModel
from sweeps.report.labels import training_label

BF16 = torch.bfloat16


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error of ``got`` against ``want``."""
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).norm() / want.norm())


def autocast_vs_fp32(module: torch.nn.Module, x: torch.Tensor):
    """Outputs and (input, parameter) gradients in fp32 and under bf16 autocast."""
    results = []
    for cast in (False, True):
        module.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=BF16, enabled=cast):
            out = module(xi)
        out.float().pow(2).sum().backward()
        grads = [xi.grad] + [p.grad for p in module.parameters()]
        results.append((out, grads))
    return results


FEATURE_MAPS = [
    partial(LLoPS, m=64, p=2), partial(LLoPS, m=64, p=4), partial(LLoPS, m=64, p=6),
    partial(LLoPS, m=64, p=4, rank=3), partial(LLoPS, m=64, p=4, affine=True),
    partial(Flatten, m=64, p=4), partial(Based, r=8),
]


@pytest.mark.parametrize("make", FEATURE_MAPS, ids=lambda f: f"{f.func.__name__}{f.keywords}")
def test_feature_map_kernels_under_autocast(make):
    torch.manual_seed(0)
    fmap = make(32)
    x = torch.randn(3, 300, 32)  # 900 rows: two CP blocks of 512 rows
    (ref, ref_grads), (out, grads) = autocast_vs_fp32(fmap, x)
    assert ref.dtype == torch.float32 and out.dtype == BF16  # documented: bf16 features
    assert rel_err(out, ref) < 0.02
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32  # fp32 leaves get fp32 gradients
        assert rel_err(got, want) < 0.03


def fp32_and_autocast(fmap: torch.nn.Module, x: torch.Tensor):
    """``fmap(x)`` in fp32 and under bf16 autocast, without gradients."""
    with torch.no_grad():
        ref = fmap(x)
        with torch.autocast("cpu", dtype=BF16):
            return ref, fmap(x)


def test_bf16_product_is_as_close_as_an_fp32_product_of_the_same_projections():
    """Why the product over p stays in bf16: the projections' rounding dominates."""
    torch.manual_seed(0)
    fmap, x = LLoPS(64, m=128, p=6), torch.randn(1024, 64)
    ref, out = fp32_and_autocast(fmap, x)
    w = fmap.theta.detach().permute(2, 1, 0, 3).reshape(64, -1)
    fp32_product = (x.to(BF16) @ w.to(BF16)).float().unflatten(-1, (6, 128)).prod(dim=-2)
    assert rel_err(out, ref) < 1.25 * rel_err(fp32_product, ref)


def test_polysketch_under_autocast():
    torch.manual_seed(0)
    ref, out = fp32_and_autocast(PolySketch(32, m=64, p=4), torch.randn(200, 32))
    assert out.dtype == BF16 and rel_err(out, ref) < 0.02


@pytest.mark.parametrize("normalize", ["none", "signed"])
def test_chunked_attention_under_autocast_keeps_fp32_state(normalize):
    """2048 tokens in 32 chunks: the state sum over chunks is fp32, so the error stays at a few
    bf16 roundings instead of growing with the number of chunks. With a denominator the
    gradient subtracts two near-equal terms (num/den and its correction), hence a wider bound."""
    gen = torch.Generator().manual_seed(0)
    f, g = (torch.rand(1, 2, 2048, 32, generator=gen) + 0.05 for _ in range(2))
    v = torch.randn(1, 2, 2048, 16, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (f, g, v)]
    ref = linear_attention(*leaves, chunk_size=64, normalize=normalize)
    ref.pow(2).sum().backward()
    ref_grads = [t.grad for t in leaves]
    leaves = [t.clone().requires_grad_() for t in (f, g, v)]
    with torch.autocast("cpu", dtype=BF16):
        out = linear_attention(*(t.to(BF16) for t in leaves), chunk_size=64,
                               normalize=normalize)
    assert out.dtype == BF16  # documented: v's dtype
    out.float().pow(2).sum().backward()
    assert rel_err(out, ref) < 0.02
    bound = 0.03 if normalize == "none" else 0.06
    for leaf, want in zip(leaves, ref_grads):
        assert leaf.grad.dtype == torch.float32 and rel_err(leaf.grad, want) < bound


def test_short_conv_under_autocast():
    torch.manual_seed(0)
    conv = ShortConv(24)
    (ref, ref_grads), (out, grads) = autocast_vs_fp32(conv, torch.randn(4, 50, 24))
    assert out.dtype == BF16
    assert rel_err(out, ref) < 0.02
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32 and rel_err(got, want) < 0.03


@pytest.mark.parametrize("mode", ["quadratic", "recurrent", "chunked"])
def test_float64_is_computed_in_float64(mode):
    gen = torch.Generator().manual_seed(0)
    f, g = (torch.rand(1, 1, 40, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 40, 3, generator=gen, dtype=torch.float64)
    scores = torch.einsum("bhim,bhjm->bhij", f, g).tril()
    want = scores @ v
    got = linear_attention(f, g, v, mode=mode, chunk_size=8, normalize=False)
    assert got.dtype == torch.float64
    assert (got - want).abs().max() < 1e-12


@pytest.mark.parametrize("make", [partial(LLoPS, 8, p=2, m=8), partial(Flatten, 8, p=2)])
def test_float64_stays_float64_under_autocast(make):
    """Autocast leaves float64 alone; so do the kernels (attention and the blocked CP map)."""
    gen = torch.Generator().manual_seed(0)
    f, g = (torch.rand(1, 1, 40, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 1, 40, 3, generator=gen, dtype=torch.float64)
    want = torch.einsum("bhim,bhjm->bhij", f, g).tril() @ v
    fm = make().double()
    x = torch.randn(3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    plain = fm(x)
    with torch.autocast("cpu", dtype=BF16):
        got = linear_attention(f, g, v, mode="chunked", chunk_size=8, normalize=False)
        phi = fm(x)
    assert got.dtype == torch.float64 and (got - want).abs().max() < 1e-12
    assert phi.dtype == torch.float64 and (phi - plain).abs().max() < 1e-12
    assert precision.kernel_dtype(torch.ones(1)) == torch.float32
    with torch.autocast("cpu", dtype=BF16):
        assert precision.kernel_dtype(torch.ones(1)) == BF16
        assert precision.kernel_dtype(torch.ones(1), torch.ones(1, dtype=torch.float64)) \
            == torch.float64


def test_bf16_warning_only_without_native_support(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda device="cpu": False)
    msg = precision.bf16_warning("bf16-mixed", "cpu")
    assert msg is not None and "without native bf16" in msg
    assert precision.bf16_warning("32-true", "cpu") is None
    monkeypatch.setattr(precision, "native_bf16", lambda device="cpu": True)
    assert precision.bf16_warning("bf16-mixed", "cpu") is None
    assert isinstance(precision.native_bf16("cpu"), bool)


METHOD_CONFIGS = ["p2.yaml", "p4.yaml", "p6.yaml", "rank.yaml", "based.yaml", "flatten.yaml",
                  "polysketch.yaml", "softmax.yaml"]


@pytest.mark.parametrize("name", METHOD_CONFIGS)
def test_smoke_fit_bf16_mixed(in_tmp, name, recwarn):
    # m = 32: seconds even where bf16 matmuls are emulated (no native bf16 on the CPU)
    small = [] if name in ("based.yaml", "softmax.yaml") else ["--model.feature_map.init_args.m",
                                                               "32"]
    cli = run(["fit", "--config", config(name), *SMOKE, *small,
               "--trainer.max_steps", "6",
               "--trainer.val_check_interval", "6", "--trainer.precision", "bf16-mixed",
               "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 6
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert 0.0 <= float(cli.trainer.callback_metrics["val/acc"]) <= 1.0
    # the weights stay fp32 under bf16-mixed: Lightning's "not supported by the model
    # summary ... Using 32 bits instead" is noise, filtered by arbench.noise
    assert not [w for w in recwarn if "not supported by the model summary" in str(w.message)]


def tiny_recall(**kw) -> RecallModel:
    torch.manual_seed(0)
    return RecallModel(vocab_size=64, d_model=32, feature_map=partial(LLoPS, m=16, p=4), **kw)


def block_outputs(model: RecallModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """The output of every block's mixer under bf16 autocast."""
    seen: list[torch.Tensor] = []
    hooks = [b.mixer.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
             for b in model.blocks]
    with torch.autocast("cpu", dtype=BF16):
        model(ids)
    for h in hooks:
        h.remove()
    return seen


def test_fp32_mixers_run_that_mixer_in_fp32_under_autocast():
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    mixed, kept = tiny_recall(), tiny_recall(fp32_mixers=["conv"])
    conv_mixed, attn_mixed = block_outputs(mixed, ids)
    conv_kept, attn_kept = block_outputs(kept, ids)
    assert conv_mixed.dtype == BF16 and conv_kept.dtype == torch.float32
    # the conv layer alone, in fp32 without autocast, gives the kept layer's output exactly
    with torch.no_grad():
        x = kept.embed(ids)
        want = kept.blocks[0].mixer(kept.blocks[0].norm(x))
    assert torch.equal(conv_kept, want)
    assert attn_kept.dtype == BF16  # the attention layer still runs under autocast
    # without autocast the switch changes nothing
    torch.testing.assert_close(mixed(ids), kept(ids), rtol=0, atol=0)


def test_fp32_mixers_must_name_a_mixer_of_the_model():
    with pytest.raises(ValueError, match="fp32_mixers names 'softmax', which is not one of "
                                         r"this model's mixers \['conv', 'linear'\]"):
        tiny_recall(fp32_mixers=["softmax"])


def test_fp32_mixers_recorded_and_labelled(in_tmp):
    cli = run(["fit", "--config", config("p2.yaml"), *SMOKE, "--model.feature_map.init_args.m",
               "16", "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
               "--trainer.precision", "bf16-mixed", "--model.fp32_mixers", "[conv]",
               "--trainer.enable_progress_bar", "false"])
    hp = cli.model.hparams_for_logging()
    assert hp["fp32_mixers"] == "conv" and hp["precision"] == "bf16-mixed"
    assert training_label(hp) == " bf16-mixed (conv in fp32)"
    assert training_label({**hp, "fp32_mixers": ""}) == " bf16-mixed"
    assert training_label({k: v for k, v in hp.items() if k != "fp32_mixers"}) == " bf16-mixed"
