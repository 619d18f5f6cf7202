"""In-context recall with repeated keys, noise and multi-token keys: MAD's noisy and fuzzy
in-context recall (multi-query), vectorised and seeded.

An example is a stream of *motifs*. A key-value motif is a key of 1..``max_key_len`` distinct
tokens from ``[1, s // 2)`` followed by a value of 1..``max_value_len`` distinct tokens from
``[s // 2, s)``, where ``s = vocab_size - noise_vocab_size``; a noise motif (probability
``noise_fraction`` each) is as many tokens drawn from the noise vocabulary
``[s, vocab_size)``. Keys are drawn with replacement, so they repeat; a key keeps the value
(tokens and length) of its first appearance, and every *repeated* key-value motif is a query:
the labels ask for its value tokens one at a time (teacher forced: the label at the key's last
token is the value's first token, the label at value token ``j`` is token ``j + 1``). A key is
matched whole: ``(3, 5)`` and ``(5,)`` are different keys.

Motifs are laid out while they fit in ``seq_len - (max_key_len + max_value_len)`` tokens; one of
the first motifs is forced to be a key-value motif, and the example ends with a repeat of a key
drawn uniformly from those shown, so every example has a query. Left padding with token 0 makes
up the length (none when keys and values are single tokens and ``seq_len`` is even).

Where MAD (athms/mad-lab ``mad/data/instances.py``, multi-query) differs:

- its training targets are every next token (here only the answers, as for MQAR);
- its fuzzy test set uses only the longest keys (here train and test draw alike);
- its keys start at token 0, here at 1 (0 is the padding), so at the same vocabulary there is
  one key token fewer: 63 keys and 64 values at ``vocab_size=144, noise_vocab_size=16``
  against MAD's 64 and 64 (fuzzy recall keeps MAD's counts: MAD's padding token is its last);
- its fuzzy final query is a probe drawn beforehand (key length uniform over 1..``max_key_len``)
  and placed at a uniform position, where here it repeats a key already shown, uniformly over
  the distinct keys, so short keys (fewer distinct ones) are asked a little less often. In
  noisy recall (single-token keys) both rules pick a key shown uniformly.

Worked example, noisy (``num_examples=1, seq_len=16, vocab_size=12, noise_vocab_size=4,
noise_fraction=0.25, seed=0``: keys 1..3, values 4..7, noise 8..11; ``.`` is ``IGNORE_INDEX``)::

    inputs   1  5  9  9 11  8 11 10  2  4  2  4  3  7  2  4
    labels   .  .  .  .  .  .  .  .  .  .  4  .  .  .  4  .

Worked example, fuzzy (``num_examples=1, seq_len=16, vocab_size=16, max_key_len=2,
max_value_len=2, seed=4``: keys 1..7, values 8..15, pad 0)::

    inputs   0  6 12 11  1 10  4  7 15  3  4 15  9  4  7 15
    labels   .  .  .  .  .  .  .  .  .  .  .  .  .  . 15  .

Motifs ``6 -> 12 11``, ``1 -> 10``, ``4 7 -> 15``, ``3 4 -> 15 9``, then the query ``4 7 -> 15``:
the key ``4 7`` is matched whole (``3 4`` shares a token with it, not the key).
"""

from __future__ import annotations

import math

import torch

from arbench.checks import check_int
from arbench.data.mqar import IGNORE_INDEX, sample_distinct

PAD = 0


def validate_in_context_recall_args(num_examples: int, seq_len: int, vocab_size: int,
                                    max_key_len: int = 1, max_value_len: int = 1,
                                    noise_fraction: float = 0.0,
                                    noise_vocab_size: int = 0) -> None:
    """Raise ``ValueError`` naming the argument and its limit for an impossible setting."""
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len),
                        ("vocab_size", vocab_size), ("max_key_len", max_key_len),
                        ("max_value_len", max_value_len)):
        check_int(name, value)
    check_int("noise_vocab_size", noise_vocab_size, minimum=0)
    if not (isinstance(noise_fraction, (int, float)) and not isinstance(noise_fraction, bool)
            and math.isfinite(noise_fraction) and 0 <= noise_fraction < 1):
        raise ValueError(f"noise_fraction must be a number in [0, 1), got {noise_fraction!r}")
    if noise_fraction > 0 and noise_vocab_size == 0:
        raise ValueError(f"noise_fraction={noise_fraction} needs noise_vocab_size >= 1 "
                         f"(noise tokens come from the top noise_vocab_size of the vocabulary)")
    longest = max_key_len + max_value_len
    if seq_len < 2 * longest:
        raise ValueError(
            f"seq_len={seq_len} is too short: a key-value motif takes up to "
            f"max_key_len+max_value_len={longest} tokens and the final query as many again, so "
            f"seq_len must be >= {2 * longest}")
    s = vocab_size - noise_vocab_size
    num_keys, num_values = s // 2 - 1, s - s // 2
    if num_keys < max_key_len or num_values < max_value_len:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: with noise_vocab_size={noise_vocab_size} it "
            f"leaves {max(num_keys, 0)} key tokens and {max(num_values, 0)} value tokens, and "
            f"keys need max_key_len={max_key_len} distinct tokens, values "
            f"max_value_len={max_value_len}")


def _first_occurrence(key_tokens: torch.Tensor, is_key: torch.Tensor) -> torch.Tensor:
    """Index of the first key-value motif of the same row with the same key, ``(b, M)``.

    ``key_tokens`` ``(b, M, K)`` holds each key left-aligned, zero after its length (tokens
    are >= 1, so the zeros make keys of different lengths differ); ``is_key`` ``(b, M)`` marks
    key-value motifs. Rows of non-key motifs get ``M`` (no occurrence counts for them).
    """
    b, m, k = key_tokens.shape
    rows = torch.arange(b).view(b, 1, 1).expand(b, m, 1)
    _, group = torch.cat([rows, key_tokens], dim=2).view(b * m, k + 1).unique(
        dim=0, return_inverse=True)
    position = torch.arange(m).repeat(b)
    position = torch.where(is_key.flatten(), position, torch.full_like(position, m))
    first = torch.full((int(group.max()) + 1,), m, dtype=torch.long)
    first.scatter_reduce_(0, group, position, reduce="amin")
    return torch.where(is_key, first[group].view(b, m), torch.full((b, m), m))


def generate_in_context_recall(num_examples: int, seq_len: int, vocab_size: int,
                               max_key_len: int = 1, max_value_len: int = 1,
                               noise_fraction: float = 0.0, noise_vocab_size: int = 0,
                               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate in-context recall examples (module docstring).

    Returns ``(inputs, labels)``, both ``torch.long`` of shape ``(num_examples, seq_len)``.
    Deterministic for given arguments (own ``torch.Generator``, global RNG untouched).
    """
    validate_in_context_recall_args(num_examples, seq_len, vocab_size, max_key_len,
                                    max_value_len, noise_fraction, noise_vocab_size)
    gen = torch.Generator().manual_seed(int(seed))
    b, kmax, vmax = num_examples, max_key_len, max_value_len
    longest = kmax + vmax
    s = vocab_size - noise_vocab_size
    half = s // 2
    budget = seq_len - longest  # tokens for the motifs before the final query
    m = budget // 2  # motifs that might fit (each takes >= 2 tokens)
    always_fit = budget // longest  # motifs that fit whatever their lengths (>= 1)

    key_len = torch.randint(1, kmax + 1, (b, m), generator=gen)
    drawn_value_len = torch.randint(1, vmax + 1, (b, m), generator=gen)
    offset = torch.arange(longest)
    key_tokens = sample_distinct(b * m, kmax, 1, half, gen).view(b, m, kmax)
    key_tokens = key_tokens.masked_fill(offset[:kmax] >= key_len.unsqueeze(-1), 0)
    drawn_values = sample_distinct(b * m, vmax, half, s, gen).view(b, m, vmax)
    is_noise = torch.rand(b, m, generator=gen) < noise_fraction
    is_noise[torch.arange(b), torch.randint(0, always_fit, (b,), generator=gen)] = False
    noise_tokens = (torch.randint(s, vocab_size, (b, m, longest), generator=gen)
                    if noise_vocab_size else torch.zeros(b, m, longest, dtype=torch.long))

    # A key keeps the value of its first appearance; a later appearance is a query.
    first = _first_occurrence(key_tokens, ~is_noise)
    source = torch.where(is_noise, torch.arange(m).expand(b, m), first)
    value_len = drawn_value_len.gather(1, source)
    values = drawn_values.gather(1, source.unsqueeze(-1).expand(b, m, vmax))
    is_query = ~is_noise & (first < torch.arange(m))
    motif_len = key_len + value_len
    fits = motif_len.cumsum(1) <= budget  # a prefix of the motifs, >= always_fit of them

    # The final motif repeats a key shown in a kept motif, uniformly over distinct keys.
    shown = fits & ~is_noise & (first == torch.arange(m))
    pick = torch.rand(b, m, generator=gen).masked_fill(~shown, -1.0).argmax(1, keepdim=True)
    key_len = torch.cat([key_len, key_len.gather(1, pick)], 1)
    value_len = torch.cat([value_len, value_len.gather(1, pick)], 1)
    key_tokens = torch.cat([key_tokens, key_tokens[torch.arange(b), pick[:, 0]].unsqueeze(1)], 1)
    values = torch.cat([values, values[torch.arange(b), pick[:, 0]].unsqueeze(1)], 1)
    is_noise = torch.cat([is_noise, torch.zeros(b, 1, dtype=torch.bool)], 1)
    noise_tokens = torch.cat([noise_tokens, noise_tokens[:, :1]], 1)
    is_query = torch.cat([is_query, torch.ones(b, 1, dtype=torch.bool)], 1)
    fits = torch.cat([fits, torch.ones(b, 1, dtype=torch.bool)], 1)
    motif_len = (key_len + value_len) * fits  # dropped motifs take no room

    # Tokens of every motif, (b, m + 1, longest): key then value, or noise.
    j = offset.view(1, 1, longest)
    klen = key_len.unsqueeze(-1)
    in_key = j < klen
    key_part = key_tokens.gather(2, j.clamp(max=kmax - 1).expand(b, m + 1, longest))
    value_part = values.gather(2, (j - klen).clamp(0, vmax - 1))
    tokens = torch.where(in_key, key_part, value_part)
    tokens = torch.where(is_noise.unsqueeze(-1), noise_tokens, tokens)
    valid = j < motif_len.unsqueeze(-1)
    # Label at token j of a query: its token j + 1, from the key's last token to the value's
    # second-to-last token.
    next_token = torch.cat([tokens[..., 1:], tokens[..., :1]], dim=2)
    answered = is_query.unsqueeze(-1) & (j >= klen - 1) & (j + 1 < motif_len.unsqueeze(-1))
    motif_labels = torch.where(answered, next_token, IGNORE_INDEX)

    pad = seq_len - motif_len.sum(1, keepdim=True)  # (b, 1) >= 0
    start = pad + motif_len.cumsum(1) - motif_len  # (b, m + 1)
    row, motif, tok = valid.nonzero(as_tuple=True)
    pos = start[row, motif] + tok
    inputs = torch.full((b, seq_len), PAD, dtype=torch.long)
    labels = torch.full((b, seq_len), IGNORE_INDEX, dtype=torch.long)
    inputs[row, pos] = tokens[row, motif, tok]
    labels[row, pos] = motif_labels[row, motif, tok]
    return inputs, labels
