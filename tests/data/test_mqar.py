import pytest
import torch

from arbench.data.mqar import IGNORE_INDEX, generate_mqar, sample_distinct


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(123)
    a = generate_mqar(50, 64, 8, vocab_size=512, seed=7)
    torch.manual_seed(999)
    torch.rand(10)
    b = generate_mqar(50, 64, 8, vocab_size=512, seed=7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = generate_mqar(50, 64, 8, vocab_size=512, seed=8)
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("random_non_queries", [True, False])
@pytest.mark.parametrize("seq_len,n,vocab", [(64, 8, 8192), (32, 8, 64), (1024, 256, 8192)])
def test_structure(seq_len, n, vocab, random_non_queries):
    x, y = generate_mqar(200, seq_len, n, vocab_size=vocab, seed=3,
                         random_non_queries=random_non_queries)
    assert x.shape == y.shape == (200, seq_len) and x.dtype == y.dtype == torch.long
    assert x.min() >= 0 and x.max() < vocab
    keys, values = x[:, 0:2 * n:2], x[:, 1:2 * n:2]
    half = vocab // 2
    assert keys.min() >= 1 and keys.max() < half
    assert values.min() >= half and values.max() < vocab
    for row in range(200):
        assert keys[row].unique().numel() == n and values[row].unique().numel() == n
        pairs = dict(zip(keys[row].tolist(), values[row].tolist()))
        pos = (y[row] != IGNORE_INDEX).nonzero().flatten()
        assert pos.numel() == n  # every key asked exactly once
        assert (pos >= 2 * n).all() and ((pos - 2 * n) % 2 == 0).all()
        asked = x[row, pos].tolist()
        assert sorted(asked) == sorted(pairs)
        for p_, k in zip(pos.tolist(), asked):
            assert y[row, p_].item() == pairs[k]  # the value paired with that key
    if not random_non_queries:
        scored = y != IGNORE_INDEX
        filler = torch.ones_like(scored)
        filler[:, :2 * n] = False
        filler &= ~scored
        assert (x[filler] == 0).all()


def test_early_slots_favoured():
    x, y = generate_mqar(4000, 256, 4, vocab_size=512, seed=0)
    slot = ((y != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2
    counts = torch.bincount(slot, minlength=124).float()
    assert counts[:4].sum() > counts[-60:].sum()  # power law: early slots dominate


def test_sample_distinct_uniform():
    gen = torch.Generator().manual_seed(0)
    draws = sample_distinct(30000, 3, 0, 6, gen)
    assert all(r.unique().numel() == 3 for r in draws[:500])
    counts = torch.bincount(draws.flatten(), minlength=6).float()
    assert (counts / counts.mean() - 1).abs().max() < 0.05
    first = torch.bincount(draws[:, 0], minlength=6).float()
    assert (first / first.mean() - 1).abs().max() < 0.08


@pytest.mark.parametrize("kwargs,match", [
    (dict(seq_len=63, num_kv_pairs=4), "seq_len must be even"),
    (dict(seq_len=30, num_kv_pairs=8), r"too short .* 4\*num_kv_pairs=32"),
    (dict(seq_len=64, num_kv_pairs=8, vocab_size=16), "exceeds the 7 distinct keys"),
    (dict(seq_len=64, num_kv_pairs=0), "num_kv_pairs must be an integer >= 1"),
    (dict(num_examples=0), "num_examples must be an integer >= 1"),
    (dict(vocab_size=-5), "vocab_size must be an integer >= 1"),
    (dict(power_a=0.0), "power_a must be a finite number > 0"),
    (dict(power_a=-1.0), "power_a"),
])
def test_errors(kwargs, match):
    args = dict(num_examples=4, seq_len=64, num_kv_pairs=4, vocab_size=512) | kwargs
    with pytest.raises(ValueError, match=match):
        generate_mqar(**args)
