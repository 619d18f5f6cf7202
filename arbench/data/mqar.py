"""Multi-query associative recall (MQAR) sequences, vectorised and seeded.

Layout of one example of length ``seq_len`` with ``N`` key-value pairs (zoology convention)::

    k1 v1 k2 v2 ... kN vN | query region of seq_len - 2N tokens

Keys come from ``[1, vocab_size // 2)``, values from ``[vocab_size // 2, vocab_size)``, both
distinct within an example. Every key is asked once in the query region, at an even offset
``2 (g - 1)`` after the context, where the slot ``g = 1, 2, ...`` is drawn without replacement
with probability proportional to ``g ** (power_a - 1)`` (early slots favoured). The label at a
query position is the value paired with that key (the model answers right after reading the
key); every other label is ``IGNORE_INDEX``.

Worked example (``num_kv_pairs=3, seq_len=16, vocab_size=16, seed=1``, random non-query
tokens; ``.`` is ``IGNORE_INDEX``)::

    inputs   5 14  2 10  7 15 |  2  7  5  9  1  7  7  0  6 13
    labels   .  .  .  .  .  . | 10  . 14  .  .  . 15  .  .  .

Keys 2, 5 and 7 are asked at offsets 0, 2 and 6 of the query region. The answer is never an
input: the token after a query is a random one. A random token may be a key (the 7s at
offsets 1 and 5), unlabelled: only the slots drawn as queries are asked.
"""

from __future__ import annotations

import math

import torch

from arbench.checks import check_int

IGNORE_INDEX = -100


def validate_mqar_args(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int,
                       power_a: float) -> None:
    """Raise ``ValueError`` naming the argument and its limit for an impossible setting."""
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len),
                        ("num_kv_pairs", num_kv_pairs), ("vocab_size", vocab_size)):
        check_int(name, value)
    if seq_len % 2:
        raise ValueError(f"seq_len must be even (key/value slots come in pairs), got {seq_len}")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(
            f"seq_len={seq_len} is too short for num_kv_pairs={num_kv_pairs}: the context takes "
            f"2*num_kv_pairs={2 * num_kv_pairs} tokens and the query region needs as many again, "
            f"so seq_len must be >= 4*num_kv_pairs={4 * num_kv_pairs}")
    check_key_value_vocab(num_kv_pairs, vocab_size)
    check_power_a(power_a)


def check_key_value_vocab(num_kv_pairs: int, vocab_size: int) -> None:
    """Raise ``ValueError`` unless ``vocab_size`` holds ``num_kv_pairs`` distinct keys (from
    ``[1, vocab_size // 2)``) and as many distinct values (from ``[vocab_size // 2, vocab_size)``)."""
    num_keys = vocab_size // 2 - 1
    num_values = vocab_size - vocab_size // 2
    if num_kv_pairs > num_keys:
        raise ValueError(
            f"num_kv_pairs={num_kv_pairs} exceeds the {num_keys} distinct keys of "
            f"vocab_size={vocab_size} (keys come from [1, vocab_size//2))")
    if num_kv_pairs > num_values:
        raise ValueError(
            f"num_kv_pairs={num_kv_pairs} exceeds the {num_values} distinct values of "
            f"vocab_size={vocab_size}")


def check_power_a(power_a: float) -> None:
    """Raise ``ValueError`` unless the query-gap power ``power_a`` is a finite number > 0."""
    if not (isinstance(power_a, (int, float)) and math.isfinite(power_a) and power_a > 0):
        raise ValueError(f"power_a must be a finite number > 0, got {power_a!r}")


def sample_distinct(num_rows: int, k: int, low: int, high: int,
                    generator: torch.Generator) -> torch.Tensor:
    """``(num_rows, k)`` integers from ``[low, high)``, distinct within each row, uniform.

    Draws with replacement and redraws only the entries that repeat an earlier one in their row.
    The procedure commutes with any relabelling of ``[low, high)``, so every ordered k-tuple of
    distinct values is equally likely. When k is a large part of the range a row-wise random
    permutation is cheaper and is used instead.
    """
    span = high - low
    if k > span:
        raise ValueError(f"cannot draw {k} distinct values from a range of {span}")
    if 4 * k > span:
        order = torch.rand(num_rows, span, generator=generator).argsort(dim=1)
        return order[:, :k] + low
    draws = torch.randint(low, high, (num_rows, k), generator=generator)
    rows = torch.arange(num_rows)
    while True:
        sorted_vals, order = draws[rows].sort(dim=1, stable=True)
        repeats = torch.zeros_like(sorted_vals, dtype=torch.bool)
        repeats[:, 1:] = sorted_vals[:, 1:] == sorted_vals[:, :-1]
        if not repeats.any():
            return draws
        bad_rows = repeats.any(dim=1)
        rows, order, repeats = rows[bad_rows], order[bad_rows], repeats[bad_rows]
        # Redraw the later copies (positions in the original row order) of repeated values.
        row_idx, pos_in_sorted = repeats.nonzero(as_tuple=True)
        cols = order[row_idx, pos_in_sorted]
        draws[rows[row_idx], cols] = torch.randint(low, high, (cols.numel(),), generator=generator)


def sample_query_slots(num_rows: int, num_slots: int, k: int, power_a: float,
                       generator: torch.Generator) -> torch.Tensor:
    """``(num_rows, k)`` distinct 0-based query slots out of ``num_slots``, each row drawn
    without replacement with probability proportional to ``g ** (power_a - 1)`` for slot
    ``g = 1, 2, ...`` (early slots favoured), in draw order.

    Weighted sampling without replacement by the Gumbel-top-k trick (Plackett-Luce order).
    """
    slot_weight = torch.arange(1, num_slots + 1, dtype=torch.float64).pow(power_a - 1)
    u = torch.rand(num_rows, num_slots, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    gumbel = -torch.log(-torch.log(u))
    return (slot_weight.log() + gumbel).topk(k, dim=1).indices


def background(num_rows: int, seq_len: int, vocab_size: int, random_non_queries: bool,
               gen: torch.Generator) -> torch.Tensor:
    """``(num_rows, seq_len)`` inputs before anything is placed: random tokens from
    ``[0, vocab_size)`` when ``random_non_queries``, else token 0."""
    if random_non_queries:
        return torch.randint(0, vocab_size, (num_rows, seq_len), generator=gen)
    return torch.zeros(num_rows, seq_len, dtype=torch.long)


def place_queries(inputs: torch.Tensor, query_pos: torch.Tensor, keys: torch.Tensor,
                  answers: torch.Tensor) -> torch.Tensor:
    """Write ``keys`` ``(b, k)`` into ``inputs`` ``(b, n)`` at ``query_pos`` ``(b, k)`` (in
    place) and return the labels: ``answers`` there, ``IGNORE_INDEX`` elsewhere."""
    inputs.scatter_(1, query_pos, keys)
    labels = torch.full(inputs.shape, IGNORE_INDEX, dtype=torch.long)
    return labels.scatter_(1, query_pos, answers)


def generate_mqar(num_examples: int, seq_len: int, num_kv_pairs: int, vocab_size: int = 8192,
                  power_a: float = 0.01, random_non_queries: bool = True,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate MQAR examples.

    Returns ``(inputs, labels)``, both ``torch.long`` of shape ``(num_examples, seq_len)``.
    Deterministic for given arguments (own ``torch.Generator``, global RNG untouched).
    Non-query slots hold random tokens from ``[0, vocab_size)`` when ``random_non_queries``,
    else token 0.
    """
    validate_mqar_args(num_examples, seq_len, num_kv_pairs, vocab_size, power_a)
    gen = torch.Generator().manual_seed(int(seed))
    n, b = num_kv_pairs, num_examples
    half = vocab_size // 2
    keys = sample_distinct(b, n, 1, half, gen)
    values = sample_distinct(b, n, half, vocab_size, gen)

    context = 2 * n
    slots = sample_query_slots(b, (seq_len - context) // 2, n, power_a, gen)
    query_pos = context + 2 * slots

    inputs = background(b, seq_len, vocab_size, random_non_queries, gen)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    return inputs, place_queries(inputs, query_pos, keys, values)
