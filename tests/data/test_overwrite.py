import pytest
import torch

from arbench.data.mqar import IGNORE_INDEX
from arbench.data.overwrite import generate_overwrite


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(1)
    a = generate_overwrite(40, 64, 8, 4, vocab_size=128, seed=5)
    torch.manual_seed(2)
    torch.rand(7)
    b = generate_overwrite(40, 64, 8, 4, vocab_size=128, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = generate_overwrite(40, 64, 8, 4, vocab_size=128, seed=6)
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("random_non_queries", [True, False])
@pytest.mark.parametrize("seq_len,n,u,vocab", [(32, 4, 2, 64), (64, 8, 8, 64), (64, 8, 0, 512),
                                               (24, 4, 2, 12)])
def test_every_label_is_the_last_value_of_its_key(seq_len, n, u, vocab, random_non_queries):
    x, y = generate_overwrite(150, seq_len, n, u, vocab_size=vocab, seed=2,
                              random_non_queries=random_non_queries)
    assert x.shape == y.shape == (150, seq_len) and x.dtype == y.dtype == torch.long
    assert x.min() >= 0 and x.max() < vocab
    half, context = vocab // 2, 2 * (n + u)
    keys, values = x[:, 0:context:2], x[:, 1:context:2]
    assert keys.min() >= 1 and keys.max() < half
    assert values.min() >= half and values.max() < vocab
    for row in range(150):
        first = dict(zip(keys[row, :n].tolist(), values[row, :n].tolist()))
        assert len(first) == n and len(set(first.values())) == n  # distinct keys and values
        last = dict(first)
        for k, v in zip(keys[row, n:].tolist(), values[row, n:].tolist()):
            assert k in first and v != first[k]  # an update reassigns a key to a new value
            last[k] = v
        assert len(set(keys[row, n:].tolist())) == u  # u different keys updated
        pos = (y[row] != IGNORE_INDEX).nonzero().flatten()
        assert pos.numel() == n and (pos >= context).all() and ((pos - context) % 2 == 0).all()
        asked = x[row, pos].tolist()
        assert sorted(asked) == sorted(first)  # every key asked once
        assert y[row, pos].tolist() == [last[k] for k in asked]
    if not random_non_queries:
        filler = y == IGNORE_INDEX
        filler[:, :context] = False
        assert (x[filler] == 0).all()


def test_query_slots_follow_the_power_law():
    """One key: the slot g = 1, 2, ... of its query has probability proportional to
    g ** (power_a - 1)."""
    power_a, seq_len, context = 0.5, 64, 4
    _, y = generate_overwrite(20_000, seq_len, 1, 1, vocab_size=64, power_a=power_a, seed=0)
    slots = ((y != IGNORE_INDEX).nonzero()[:, 1] - context) // 2
    num_slots = (seq_len - context) // 2
    counts = torch.bincount(slots, minlength=num_slots).double()
    weight = torch.arange(1, num_slots + 1, dtype=torch.float64).pow(power_a - 1)
    expected = 20_000 * weight / weight.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 2 * num_slots, chi2  # chi-square with num_slots - 1 degrees of freedom


def test_new_values_are_uniform_over_the_other_values():
    x, _ = generate_overwrite(20_000, 8, 1, 1, vocab_size=8, seed=0)
    first, new = x[:, 1], x[:, 3]
    assert (first != new).all()
    for v in range(4, 8):
        counts = torch.bincount(new[first == v], minlength=8)[4:].double()
        others = counts[torch.arange(4) != v - 4]
        assert counts[v - 4] == 0 and (others / others.mean() - 1).abs().max() < 0.1


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_updates=5), "num_updates=5 exceeds num_kv_pairs=4"),
    (dict(seq_len=18), r"seq_len=18 is too short .* seq_len must be >= 20"),
    (dict(seq_len=31), "seq_len must be even"),
    (dict(vocab_size=8), "exceeds the 3 distinct keys of vocab_size=8"),
    (dict(num_updates=-1), "num_updates must be an integer >= 0"),
    (dict(num_updates=None), "num_updates must be an integer >= 0, got None"),
    (dict(num_kv_pairs=0), "num_kv_pairs must be an integer >= 1"),
    (dict(power_a=0.0), "power_a must be a finite number > 0"),
])
def test_errors(kwargs, match):
    args = dict(num_examples=4, seq_len=32, num_kv_pairs=4, num_updates=2, vocab_size=64) | kwargs
    with pytest.raises(ValueError, match=match):
        generate_overwrite(**args)
