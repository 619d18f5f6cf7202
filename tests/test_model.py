import functools

import pytest
import torch
import torch.nn.functional as F

from arbench.data import generate_mqar
from arbench.featuremaps import Identity, LLoPS
from arbench.model import RecallModel
from arbench.registry import FEATURE_MAPS, FEATURE_MIXERS, MIXERS

SMALL = {"llops": dict(m=16, p=4), "flatten": dict(m=16, p=2), "based": dict(r=4),
         "polysketch": dict(m=16, p=2)}
MAPS = {name: functools.partial(cls, **SMALL.get(name, {})) for name, cls in FEATURE_MAPS.items()}
MAPS["llops_rank"] = functools.partial(LLoPS, m=16, p=3, rank=2)
STATE_MIXERS = {name: MIXERS[name] for name in FEATURE_MIXERS if name != "linear"}


def smoke_model(mixers, feature_map=None, **kw):
    torch.manual_seed(0)
    return RecallModel(vocab_size=64, d_model=16, n_layers=2, mixers=mixers, num_heads=2,
                       feature_map=feature_map, **kw)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_forward_backward_every_feature_map(name):
    model = smoke_model(["conv", "linear"], MAPS[name])
    x, y = generate_mqar(4, 32, 4, vocab_size=64, seed=0)
    loss = model.loss(x, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert model(x).shape == (4, 32, 64)


@pytest.mark.parametrize("mixer", sorted(STATE_MIXERS))
@pytest.mark.parametrize("name", sorted(MAPS))
def test_state_mixers_with_every_feature_map(mixer, name):
    model = smoke_model(["conv", mixer], MAPS[name])
    layer = model.blocks[1].mixer
    assert type(layer) is STATE_MIXERS[mixer]
    x, y = generate_mqar(2, 24, 4, vocab_size=64, seed=0)
    loss = model.loss(x, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # m·dv·heads for the attention layer plus the conv window
    assert model.state_size(24) == layer.feature_dim * 8 * 2 + 3 * 16
    assert model.attention_hparams()["feature_map"] == layer.phi_q.hparams()["feature_map"]


@pytest.mark.parametrize("mixer", sorted(STATE_MIXERS))
def test_state_mixer_modes_agree_in_model(mixer):
    x, _ = generate_mqar(2, 30, 4, vocab_size=64, seed=1)
    outs = [smoke_model(["conv", mixer], MAPS["llops"], attention_mode=mode, chunk_size=8)(x)
            for mode in ("chunked", "recurrent")]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mixers", [["conv", "softmax"], ["softmax"], ["conv"]])
def test_forward_backward_other_mixers(mixers):
    model = smoke_model(mixers)
    x, y = generate_mqar(4, 32, 4, vocab_size=64, seed=0)
    model.loss(x, y).backward()


def test_selective_head_loss_equals_full_head_loss():
    model = smoke_model(["conv", "linear"], MAPS["llops"], use_mlp=True)
    x, y = generate_mqar(8, 32, 4, vocab_size=64, seed=1)
    full = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    torch.testing.assert_close(model.loss(x, y), full)


def test_layers_repeat_and_state_size():
    model = RecallModel(vocab_size=64, d_model=16, n_layers=4, mixers=["conv", "linear"],
                        num_heads=2, feature_map=MAPS["llops"])
    assert model.mixer_names == ["conv", "linear", "conv", "linear"]
    # two linear layers with m·dv·heads each, plus two conv windows of kernel·d_model
    assert model.state_size(32) == 2 * (16 * 8 * 2) + 2 * (3 * 16)
    soft = smoke_model(["softmax"])
    assert soft.state_size(100) == 2 * (2 * 100 * 16)


def test_tied_head():
    model = smoke_model(["conv", "softmax"])
    assert model.head.weight is model.embed.weight


def test_linear_modes_agree_in_model():
    x, _ = generate_mqar(2, 32, 4, vocab_size=64, seed=1)
    outs = []
    for mode in ("chunked", "quadratic", "recurrent"):
        outs.append(smoke_model(["conv", "linear"], MAPS["llops"], attention_mode=mode,
                                chunk_size=8)(x))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=30, num_heads=4), "not divisible by num_heads"),
    (dict(mixers=["conv", "mamba"]), "mixers must be a non-empty list"),
    (dict(mixers=["linear"]), "no feature_map was given"),
    (dict(mixers=["conv", "gated_delta"]), "mixers include 'gated_delta' but no feature_map"),
    (dict(mixers=["delta"], feature_map=Identity, normalize="signed"),
     "the delta rule has no denominator"),
    (dict(mixers=["delta"], feature_map=Identity, attention_mode="quadratic"),
     "delta rule mode must be one of"),
    (dict(mixers=["gated"], feature_map=Identity, attention_mode="fast"),
     "attention mode must be one of"),
    (dict(n_layers=0), "n_layers must be an integer >= 1"),
    (dict(mixers=["linear"], feature_map=functools.partial(LLoPS, p=0)), "p must be"),
    (dict(mixers=["linear"], feature_map=functools.partial(LLoPS, rank=0)), "rank must be"),
    (dict(mixers=["linear"], feature_map=functools.partial(LLoPS, m=0)), "m must be"),
])
def test_construction_errors(kwargs, match):
    args = dict(vocab_size=64, d_model=16, num_heads=2, mixers=["conv", "softmax"]) | kwargs
    with pytest.raises(ValueError, match=match):
        RecallModel(**args)


def test_compiled_body_matches_eager_loss_and_gradients():
    eager = smoke_model(["conv", "linear"], MAPS["llops_rank"])
    compiled = smoke_model(["conv", "linear"], MAPS["llops_rank"])
    compiled.compile_body()
    compiled.compile_body()  # idempotent
    x, y = generate_mqar(4, 32, 4, vocab_size=64, seed=1)
    losses = []
    for model in (eager, compiled):
        loss = model.loss(x, y)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert compiled.state_dict().keys() == eager.state_dict().keys()
