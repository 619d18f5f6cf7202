"""zoology's backbone (issue 13's diagnosis): BaseConv, its block, its init, its Based layer."""

import functools
import importlib
import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from paths import SMOKE, config

from arbench.cli import run
from arbench.featuremaps import Based, LLoPS
from arbench.mixers import BaseConv, DecayGate
from arbench.model import RecallModel, normal_init


def model_from_config(name: str, vocab_size: int) -> RecallModel:
    """The ``model`` section of a method config, built directly (vocabulary given)."""
    section = yaml.safe_load(open(config(name)))["model"]
    spec = section.pop("feature_map")
    module, cls = spec["class_path"].rsplit(".", 1)
    factory = functools.partial(getattr(importlib.import_module(module), cls),
                                **spec.get("init_args", {}))
    torch.manual_seed(0)
    return RecallModel(vocab_size=vocab_size, feature_map=factory, **section)


def test_parameter_counts_match_zoology_and_arbench_at_d128_vocab512():
    # zoology's Based MQAR model at d = 128, vocab 512 has 120,704 parameters (issue 13);
    # arbench's own BASED model 186,112.
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(model_from_config("zoology_based.yaml", 512)) == 120_704
    assert count(model_from_config("based.yaml", 512)) == 186_112


def test_base_conv_is_conv_times_projection_plus_input():
    torch.manual_seed(0)
    layer = BaseConv(8, kernel_size=3)
    u = torch.randn(2, 11, 8)
    conv = F.conv1d(u.transpose(1, 2), layer.conv.weight, layer.conv.bias, padding=2,
                    groups=8)[..., :11].transpose(1, 2)
    want = conv * (u @ layer.projection.weight.T + layer.projection.bias) + u
    torch.testing.assert_close(layer(u), want)
    u[:, 6:] = 0.0  # causal: the first 6 outputs do not see later inputs
    torch.testing.assert_close(layer(u)[:, :6], want[:, :6])


def test_zoology_block_follows_zoologys_residual_stream():
    model = model_from_config("zoology_based.yaml", 64).double()
    x = torch.randint(0, 64, (2, 16))
    b0, b1 = model.blocks
    e = model.embed(x)
    r1 = b0.mixer(b0.norm(e)) + e          # layer 0: residual starts at the embedding
    h1 = b0.norm2(r1)                      # the identity state mixer passes norm2 on
    r2 = h1 + r1
    r2 = b1.mixer(b1.norm(r2)) + r2
    h2 = b1.norm2(r2)
    want = model.head(model.final_norm(h2 + r2))
    torch.testing.assert_close(model(x), want)


def test_normal_init_sets_linear_maps_and_keeps_the_rest():
    torch.manual_seed(0)
    model = RecallModel(vocab_size=256, d_model=64, mixers=["conv", "gated"],
                        feature_map=functools.partial(LLoPS, m=32, p=2))
    gate = next(m for m in model.modules() if isinstance(m, DecayGate))
    kept = {"gate_bias": gate.proj.bias.clone(),
            "conv": model.blocks[0].mixer.conv.weight.clone(),
            "theta": model.blocks[1].mixer.phi_q.theta.clone()}
    normal_init(model, 0.02)
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and \
                module.weight.numel() >= 1024:
            assert abs(module.weight.std().item() - 0.02) < 0.002, name
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.bias is not None \
                and module is not gate.proj:
            assert torch.count_nonzero(module.bias) == 0
    torch.testing.assert_close(gate.proj.bias, kept["gate_bias"])
    torch.testing.assert_close(model.blocks[0].mixer.conv.weight, kept["conv"])
    torch.testing.assert_close(model.blocks[1].mixer.phi_q.theta, kept["theta"])


def test_based_without_projection_has_the_taylor_kernel():
    fmap = Based(16, r=16, project=False).double()
    q, k = torch.randn(5, 16, dtype=torch.float64), torch.randn(5, 16, dtype=torch.float64)
    s = (q * k).sum(-1) / math.sqrt(16)
    torch.testing.assert_close((fmap(q) * fmap(k)).sum(-1), 1 + s + s * s / 2)
    assert not list(fmap.parameters())
    with pytest.raises(ValueError, match="r must equal their head dimension 32"):
        Based(32, r=16, project=False)


@pytest.mark.parametrize("mixer", ["linear", "gated", "delta"])
def test_narrow_qk_gives_the_same_output_in_every_mode(mixer):
    def build(mode):
        torch.manual_seed(0)
        return RecallModel(vocab_size=64, d_model=32, num_heads=2, mixers=["base_conv", mixer],
                           feature_map=functools.partial(Based, r=4, project=False), qk_dim=8,
                           attention_mode=mode, chunk_size=8).double()
    x = torch.randint(0, 64, (2, 21))
    modes = ["chunked", "recurrent"] if mixer == "delta" else ["chunked", "quadratic"]
    torch.testing.assert_close(build(modes[0])(x), build(modes[1])(x))
    assert build("chunked").blocks[1].mixer.qkv.out_features == 2 * 8 + 32


def test_backbone_options_one_clear_error():
    fm = functools.partial(LLoPS, m=8, p=2)
    for kw, needle in [({"block": "post"}, "block must be one of"),
                       ({"init_std": 0}, "init_std must be a positive number"),
                       ({"qk_dim": 3}, "qk_dim=3 must be a positive multiple of num_heads=2"),
                       ({"attention_eps": -1.0}, "attention_eps must be a positive")]:
        with pytest.raises(ValueError, match=needle):
            RecallModel(vocab_size=64, d_model=16, num_heads=2, feature_map=fm, **kw)


@pytest.mark.parametrize("name", ["zoology_based.yaml", "zoology_p4.yaml", "zoology_p6.yaml"])
def test_zoology_configs_train_at_smoke_size(in_tmp, name):
    cli = run(["fit", "--config", config(name), *SMOKE,
               "--trainer.max_steps", "6", "--trainer.val_check_interval", "6",
               "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 6
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
