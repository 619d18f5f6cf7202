"""Learned absolute position embeddings (``model.max_position_embeddings``): off by default,
what they add, the length check, the hparam and the label."""

import pytest
import torch
from paths import SMOKE, config

from arbench.cli import run
from arbench.data import generate_mqar
from arbench.featuremaps import Based
from arbench.model import RecallModel
from sweeps.report.labels import label


def model(**kw) -> RecallModel:
    torch.manual_seed(0)
    return RecallModel(vocab_size=64, d_model=16, mixers=["conv", "softmax"], **kw)


def test_default_has_no_position_parameters():
    plain = model()
    assert plain.position_embed is None
    assert sum(p.numel() for p in model(max_position_embeddings=32).parameters()) == \
        sum(p.numel() for p in plain.parameters()) + 32 * 16


def test_positions_make_the_model_order_aware():
    """A zero table gives the model without positions; a non-zero one changes the hidden
    states and not the token embedding."""
    pos = model(max_position_embeddings=32)
    x = torch.randint(0, 64, (2, 32))
    emb = pos.embed(x)
    pos.position_embed.weight.data.zero_()
    zeroed = pos.hidden(x)
    plain = model()
    plain.load_state_dict({k: v for k, v in pos.state_dict().items()
                           if not k.startswith("position_embed")})
    torch.testing.assert_close(zeroed, plain.hidden(x))  # a zero table changes nothing
    pos.position_embed.weight.data.normal_()
    assert not torch.allclose(pos.hidden(x), zeroed)
    assert torch.equal(pos.embed(x), emb)


def test_sequence_longer_than_positions_is_one_clear_error():
    pos = model(max_position_embeddings=16)
    x, y = generate_mqar(2, 32, 4, vocab_size=64, seed=0)
    with pytest.raises(ValueError, match="32 tokens is longer than model.max_position_embeddings=16"):
        pos.loss(x, y)


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_bad_max_position_embeddings(bad):
    with pytest.raises(ValueError, match="max_position_embeddings must be an integer >= 0"):
        model(max_position_embeddings=bad)


def test_positions_train_and_are_recorded(in_tmp):
    cli = run(["fit", "--config", config("based.yaml"), *SMOKE,
               "--model.max_position_embeddings", "128", "--trainer.max_steps", "4",
               "--trainer.enable_progress_bar", "false"])
    hp = cli.model.hparams_for_logging()
    assert hp["max_position_embeddings"] == 128
    assert "pos-emb" in label(hp)
    assert "pos-emb" not in label({**hp, "max_position_embeddings": 0})


def test_data_longer_than_positions_stops_at_setup(in_tmp, capsys):
    with pytest.raises(SystemExit):
        run(["fit", "--config", config("based.yaml"), *SMOKE,
             "--model.max_position_embeddings", "16", "--trainer.max_steps", "2"])
    err = capsys.readouterr().err.strip()
    assert "longer than model.max_position_embeddings=16" in err and "Traceback" not in err


def test_feature_map_models_take_positions():
    based = RecallModel(vocab_size=64, d_model=16, feature_map=lambda d: Based(d, r=4),
                        max_position_embeddings=32)
    x, y = generate_mqar(2, 32, 4, vocab_size=64, seed=0)
    based.loss(x, y).backward()
    assert based.position_embed.weight.grad.abs().sum() > 0
