import pytest
import torch

from arbench.data.incontext import PAD, generate_in_context_recall
from arbench.data.mqar import IGNORE_INDEX


def motifs(row: list[int], vocab_size: int, noise_vocab_size: int) -> list[tuple]:
    """The key-value motifs of one example, read back from its tokens alone: ``(key tuple,
    value tuple, position of the key's last token)``. Keys and values are runs of their own
    vocabularies; noise runs and the left padding are skipped."""
    s = vocab_size - noise_vocab_size

    def kind(t: int) -> str:
        return "pad" if t == PAD else "key" if t < s // 2 else "value" if t < s else "noise"

    runs: list[tuple[str, list[int], int]] = []  # (kind, tokens, last position)
    for pos, t in enumerate(row):
        if runs and runs[-1][0] == kind(t):
            runs[-1][1].append(t)
            runs[-1] = (runs[-1][0], runs[-1][1], pos)
        else:
            runs.append((kind(t), [t], pos))
    assert all(k != "pad" for k, _, _ in runs[1:])  # padding only on the left
    out = []
    for (k1, toks1, end1), (k2, toks2, _) in zip(runs, runs[1:]):
        if k1 == "key":
            assert k2 == "value"  # every key is followed by its value
            out.append((tuple(toks1), tuple(toks2), end1))
    return out


def expected_labels(row: list[int], vocab_size: int, noise_vocab_size: int) -> list[int]:
    """Labels by the rule: a key seen before asks for its (first) value, token by token."""
    labels = [IGNORE_INDEX] * len(row)
    known: dict[tuple, tuple] = {}
    for key, value, end in motifs(row, vocab_size, noise_vocab_size):
        if key in known:
            assert value == known[key]  # a key keeps its value
            for j, v in enumerate(value):
                labels[end + j] = v
        known.setdefault(key, value)
    return labels


SETTINGS = [
    dict(seq_len=64, vocab_size=32, noise_fraction=0.2, noise_vocab_size=16),
    dict(seq_len=32, vocab_size=40, noise_fraction=0.8, noise_vocab_size=8),
    dict(seq_len=64, vocab_size=16, max_key_len=3, max_value_len=3),
    dict(seq_len=12, vocab_size=16, max_key_len=3, max_value_len=3),
    dict(seq_len=48, vocab_size=64, max_key_len=2, max_value_len=3, noise_fraction=0.3,
         noise_vocab_size=8),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_every_label_follows_from_the_input(settings):
    x, y = generate_in_context_recall(300, seed=1, **settings)
    vocab, noise = settings["vocab_size"], settings.get("noise_vocab_size", 0)
    assert x.shape == y.shape == (300, settings["seq_len"]) and x.dtype == y.dtype == torch.long
    assert x.min() >= 0 and x.max() < vocab
    s = vocab - noise
    scored = y != IGNORE_INDEX
    assert ((y[scored] >= s // 2) & (y[scored] < s)).all()  # answers are values, never noise
    assert (x[scored] < s).all() and (x[scored] != PAD).all()  # asked at keys and values only
    assert scored[:, -1].logical_not().all() and scored[:, -2].all()  # ends with a query
    for row in range(300):
        assert y[row].tolist() == expected_labels(x[row].tolist(), vocab, noise)


def test_single_token_keys_fill_the_sequence_without_padding():
    x, _ = generate_in_context_recall(200, 64, 32, noise_fraction=0.4, noise_vocab_size=16,
                                      seed=0)
    assert (x != PAD).all()


def test_deterministic_and_independent_of_global_rng():
    args = dict(num_examples=30, seq_len=64, vocab_size=16, max_key_len=3, max_value_len=2)
    torch.manual_seed(0)
    a = generate_in_context_recall(**args, seed=4)
    torch.manual_seed(9)
    torch.rand(3)
    b = generate_in_context_recall(**args, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], generate_in_context_recall(**args, seed=5)[0])


def test_noise_fraction_is_the_share_of_noise_motifs():
    """Each of the m = (seq_len - 2) / 2 motifs before the final query is noise with probability
    noise_fraction, except one forced key-value motif; the final query is never noise."""
    seq_len, fraction = 64, 0.6
    x, _ = generate_in_context_recall(4000, seq_len, 32, noise_fraction=fraction,
                                      noise_vocab_size=16, seed=0)
    m = (seq_len - 2) // 2
    expected = fraction * (m - 1) / (m + 1)
    assert abs(float((x >= 16).double().mean()) - expected) < 0.005


def test_fuzzy_keys_are_matched_whole_and_lengths_uniform():
    x, _ = generate_in_context_recall(400, 96, 16, max_key_len=3, max_value_len=3, seed=2)
    key_lens, value_lens, overlapping = [], [], 0
    for row in x.tolist():
        found = motifs(row, 16, 0)
        values = {}
        for key, value, _ in found[:-1]:  # the final query repeats a key
            key_lens.append(len(key))
            value_lens.append(len(value))
            values.setdefault(key, value)
        # distinct keys sharing a token, with different values: only the whole key decides
        overlapping += sum(1 for a in values for b in values
                           if a != b and set(a) & set(b) and values[a] != values[b])
    assert overlapping > 0
    for lens in (torch.tensor(key_lens), torch.tensor(value_lens)):
        counts = torch.bincount(lens, minlength=4)[1:].double()
        assert (counts / counts.mean() - 1).abs().max() < 0.1


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_fraction=1.0), r"noise_fraction must be a number in \[0, 1\), got 1.0"),
    (dict(noise_fraction=-0.1), r"noise_fraction must be a number in \[0, 1\)"),
    (dict(noise_fraction=float("nan")), "noise_fraction must be a number"),
    (dict(noise_fraction=0.2, noise_vocab_size=0), "needs noise_vocab_size >= 1"),
    (dict(vocab_size=18, noise_vocab_size=16), "vocab_size=18 is too small"),
    (dict(vocab_size=8, noise_fraction=0.0, noise_vocab_size=0, max_key_len=4),
     r"leaves 3 key tokens .* max_key_len=4"),
    (dict(seq_len=11, max_key_len=3, max_value_len=3), "seq_len must be >= 12"),
    (dict(max_key_len=0), "max_key_len must be an integer >= 1"),
    (dict(noise_vocab_size=-1), "noise_vocab_size must be an integer >= 0"),
])
def test_errors(kwargs, match):
    args = dict(num_examples=4, seq_len=32, vocab_size=32, noise_fraction=0.2,
                noise_vocab_size=8) | kwargs
    with pytest.raises(ValueError, match=match):
        generate_in_context_recall(**args)
