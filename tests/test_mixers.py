import math

import pytest
import torch
import torch.nn.functional as F

from arbench.attention import delta_attention, linear_attention
from arbench.delta import l2_normalize
from arbench.featuremaps import EluPlusOne, Identity, LLoPS
from arbench.mixers import (
    DecayGate,
    DeltaAttention,
    GatedLinearAttention,
    LinearAttention,
    ShortConv,
)


def test_short_conv_is_causal():
    torch.manual_seed(0)
    mixer = ShortConv(4)
    x = torch.randn(1, 8, 4)
    y = x.clone()
    y[:, 5:] += 1.0  # change the future only
    torch.testing.assert_close(mixer(x)[:, :5], mixer(y)[:, :5])


def test_linear_attention_parameters_unchanged():
    # registration order fixes the draws of a seeded init: checkpoints and results stay valid
    layer = LinearAttention(16, 2, lambda d: LLoPS(d, m=8, p=2))
    assert [n for n, _ in layer.named_parameters()] == [
        "qkv.weight", "out.weight", "phi_q.theta", "phi_k.theta", "norm.weight"]


@pytest.mark.parametrize("heads", [1, 4])
def test_decay_gate_starts_near_one(heads):
    gate = DecayGate(16, heads)
    alpha = torch.exp(-F.softplus(gate.proj.bias))
    assert ((alpha > 0.99 - 1e-6) & (alpha < 0.999 + 1e-6)).all()
    if heads > 1:  # spread over the range, ends included
        torch.testing.assert_close(alpha[[0, -1]], torch.tensor([0.99, 0.999]))
    log_decay = gate(torch.randn(2, 5, 16))
    assert log_decay.shape == (2, heads, 5) and (log_decay <= 0).all()


def test_gated_mixer_is_linear_attention_with_the_gate():
    torch.manual_seed(0)
    layer = GatedLinearAttention(8, 2, EluPlusOne)
    x = torch.randn(2, 11, 8)
    q, k, v = (t.unflatten(-1, (2, 4)).transpose(1, 2) for t in layer.qkv(x).chunk(3, dim=-1))
    y = linear_attention(layer.phi_q(q), layer.phi_k(k), v, normalize=False,
                         log_decay=-F.softplus(layer.decay.proj(x)).transpose(1, 2))
    want = layer.out(layer.norm(y).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(layer(x), want)


@pytest.mark.parametrize("gated", [False, True])
def test_delta_mixer_normalises_features_and_uses_beta(gated):
    torch.manual_seed(0)
    layer = DeltaAttention(8, 2, Identity, gated=gated, output_norm=False)
    assert isinstance(layer.norm, torch.nn.Identity) and (layer.decay is not None) == gated
    x = torch.randn(2, 11, 8)
    q, k, v = (t.unflatten(-1, (2, 4)).transpose(1, 2) for t in layer.qkv(x).chunk(3, dim=-1))
    beta = torch.sigmoid(layer.beta(x)).transpose(1, 2)
    log_decay = -F.softplus(layer.decay.proj(x)).transpose(1, 2) if gated else None
    y = delta_attention(l2_normalize(q), l2_normalize(k), v, beta,
                        log_decay=log_decay, mode="recurrent")
    torch.testing.assert_close(layer(x), layer.out(y.transpose(1, 2).flatten(-2)),
                               rtol=1e-5, atol=1e-6)
    assert layer.state_size(11) == 4 * 4 * 2
    assert layer.hparams() == {"feature_map": "Identity", "m": 4, "normalize": "none",
                               "qk_norm": False}


@pytest.mark.parametrize("cls", [GatedLinearAttention, DeltaAttention])
def test_state_mixers_are_causal(cls):
    torch.manual_seed(0)
    layer = cls(8, 2, EluPlusOne, chunk_size=4)
    x = torch.randn(1, 10, 8)
    y = x.clone()
    y[:, 6:] += 1.0  # change the future only
    torch.testing.assert_close(layer(x)[:, :6], layer(y)[:, :6])
    assert not torch.allclose(layer(x)[:, 6:], layer(y)[:, 6:])
    assert math.isfinite(layer(x).sum().item())


def test_qk_norm_gives_unit_variance_vectors_to_the_feature_maps():
    seen = []

    class Spy(EluPlusOne):
        def forward(self, x):
            seen.append(x.detach())
            return super().forward(x)

    torch.manual_seed(0)
    layer = LinearAttention(32, 2, Spy, qk_norm=True)
    x = torch.randn(3, 10, 32) * 5 + 2
    layer(x)
    for t in seen:  # q and k, (b, h, n, head_dim): each head vector standardised
        torch.testing.assert_close(t.mean(-1), torch.zeros(t.shape[:-1]), atol=1e-5, rtol=0)
        torch.testing.assert_close(t.var(-1, unbiased=False), torch.ones(t.shape[:-1]),
                                   atol=1e-3, rtol=0)
    assert len(seen) == 2 and layer.hparams()["qk_norm"] is True
    assert not any("norm" in n and "qk" in n for n, _ in layer.named_parameters())  # no affine
