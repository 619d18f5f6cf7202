import pytest
import torch

from arbench.data.copying import BLANK, generate_selective_copying
from arbench.data.mqar import IGNORE_INDEX


@pytest.mark.parametrize("seq_len,t,vocab", [(32, 4, 64), (256, 16, 16), (10, 4, 3)])
def test_labels_are_the_scattered_tokens_in_order(seq_len, t, vocab):
    x, y = generate_selective_copying(200, seq_len, t, vocab, seed=1)
    assert x.shape == y.shape == (200, seq_len) and x.dtype == y.dtype == torch.long
    assert x.min() >= 0 and x.max() < vocab
    marker, region = vocab - 1, seq_len - t - 1
    assert (x[:, region] == marker).all() and (x[:, region + 1:] == BLANK).all()
    assert (x[:, :region] != marker).all()
    for row in range(200):
        before = x[row, :region]
        content = before[before != BLANK]
        assert content.numel() == t and content.min() >= 1
        scored = y[row] != IGNORE_INDEX
        assert scored.nonzero().flatten().tolist() == list(range(region + 1, seq_len))
        assert y[row, scored].tolist() == content.tolist()  # order kept


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(0)
    a = generate_selective_copying(30, 64, 8, 16, seed=3)
    torch.manual_seed(5)
    torch.rand(2)
    b = generate_selective_copying(30, 64, 8, 16, seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], generate_selective_copying(30, 64, 8, 16, seed=4)[0])


def test_blanks_precede_the_tokens_as_mad_places_them():
    """Each blank goes before one of the T tokens, uniformly and independently (MAD's
    ``np.insert`` at ``randint(0, T)``): the blanks before each token are Binomial(B, 1/T), none
    follow the last token, and the content tokens are uniform."""
    seq_len, t, vocab = 40, 5, 12
    n, blanks = 20_000, seq_len - 2 * t - 1
    x, _ = generate_selective_copying(n, seq_len, t, vocab, seed=0)
    region = x[:, :seq_len - t - 1]
    assert (region[:, -1] != BLANK).all()  # the last token stands just before the marker
    places = torch.stack([row.nonzero().flatten() for row in region != BLANK])  # (n, t)
    before = torch.diff(places, dim=1, prepend=torch.full((n, 1), -1)) - 1  # blanks before each
    assert (before.sum(1) == blanks).all()
    mean, var = blanks / t, blanks * (1 / t) * (1 - 1 / t)
    assert (before.double().mean(0) - mean).abs().max() < 5 * (var / n) ** 0.5
    assert (before.double().var(0) / var - 1).abs().max() < 0.05
    tokens = torch.bincount(region[region != BLANK], minlength=vocab)[1:vocab - 1].double()
    assert (tokens / tokens.mean() - 1).abs().max() < 0.06


@pytest.mark.parametrize("kwargs,match", [
    (dict(seq_len=9), r"seq_len=9 is too short .* seq_len >= 2\*num_tokens_to_copy\+2=10"),
    (dict(vocab_size=2), "vocab_size=2 is too small"),
    (dict(num_tokens_to_copy=0), "num_tokens_to_copy must be an integer >= 1, got 0"),
    (dict(num_examples=1.5), "num_examples must be an integer >= 1, got 1.5"),
])
def test_errors(kwargs, match):
    args = dict(num_examples=4, seq_len=32, num_tokens_to_copy=4, vocab_size=16) | kwargs
    with pytest.raises(ValueError, match=match):
        generate_selective_copying(**args)
