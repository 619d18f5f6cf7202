"""Overwrite (forgetting) MQAR: some keys are reassigned a new value later in the context.

zoology's ``forgetting_mqar`` semantics, vectorised and seeded. Layout of one example with ``N``
key-value pairs of which ``U`` are updated::

    k1 v1 ... kN vN | ku1 v'u1 ... kuU v'uU | query region of seq_len - 2 (N + U) tokens

The ``N`` keys are distinct, from ``[1, vocab_size // 2)``; their first values are distinct,
from ``[vocab_size // 2, vocab_size)``. Then ``U`` distinct keys of the ``N``, in random order,
are paired with a new value drawn uniformly from the value half minus the key's first value.
Every key is asked once in the query region, at the power-law slots of
:func:`arbench.data.mqar.sample_query_slots`; the label there is the key's *last* value.

Worked example (``num_kv_pairs=3, num_updates=1, seq_len=16, vocab_size=16,
random_non_queries=False, seed=1``; ``.`` is ``IGNORE_INDEX``)::

    inputs   5 14  2 10  7 15  5 11 |  2  0  5  0  7  0  0  0
    labels   .  .  .  .  .  .  .  . | 10  . 11  . 15  .  .  .

Key 5 was first paired with 14, then with 11: its query answers 11.

The query region's other slots hold random tokens (``random_non_queries``, as zoology's), so
one may be a key of the example followed by a random token: a rule blind to position would
read that pair as another update, more often in longer examples. The label is the value of the
context region (the first ``2 (N + U)`` tokens), which a model with positions can tell apart;
the ``overwrite`` profile gives every model position embeddings.

One difference from zoology's code: there the new value of the ``j``-th update only avoids the
first value of the ``j``-th key, not that of the key it is given to (drawn separately), so about
one update in ``vocab_size / 2`` reassigns a key its own value; here the new value always
differs from the updated key's first value, as the task means.
"""

from __future__ import annotations

import torch

from arbench.checks import check_int
from arbench.data.mqar import (
    background,
    check_key_value_vocab,
    check_power_a,
    place_queries,
    sample_distinct,
    sample_query_slots,
)


def validate_overwrite_args(num_examples: int, seq_len: int, num_kv_pairs: int,
                            num_updates: int, vocab_size: int, power_a: float) -> None:
    """Raise ``ValueError`` naming the argument and its limit for an impossible setting."""
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len),
                        ("num_kv_pairs", num_kv_pairs), ("vocab_size", vocab_size)):
        check_int(name, value)
    check_int("num_updates", num_updates, minimum=0)
    if seq_len % 2:
        raise ValueError(f"seq_len must be even (key/value slots come in pairs), got {seq_len}")
    if num_updates > num_kv_pairs:
        raise ValueError(f"num_updates={num_updates} exceeds num_kv_pairs={num_kv_pairs} "
                         f"(each update reassigns a different key)")
    need = 2 * (num_kv_pairs + num_updates) + 2 * num_kv_pairs
    if need > seq_len:
        raise ValueError(
            f"seq_len={seq_len} is too short for num_kv_pairs={num_kv_pairs} with "
            f"num_updates={num_updates}: the context takes 2*(num_kv_pairs+num_updates)="
            f"{2 * (num_kv_pairs + num_updates)} tokens and the queries "
            f"2*num_kv_pairs={2 * num_kv_pairs}, so seq_len must be >= {need}")
    check_key_value_vocab(num_kv_pairs, vocab_size)  # one key at least: two values at least
    check_power_a(power_a)


def generate_overwrite(num_examples: int, seq_len: int, num_kv_pairs: int, num_updates: int,
                       vocab_size: int = 8192, power_a: float = 0.01,
                       random_non_queries: bool = True,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate overwrite-MQAR examples (module docstring).

    Returns ``(inputs, labels)``, both ``torch.long`` of shape ``(num_examples, seq_len)``;
    labels are ``IGNORE_INDEX`` except at the ``num_kv_pairs`` query positions. Deterministic
    for given arguments (own ``torch.Generator``). Non-query slots of the query region hold
    random tokens from ``[0, vocab_size)`` when ``random_non_queries``, else token 0.
    """
    validate_overwrite_args(num_examples, seq_len, num_kv_pairs, num_updates, vocab_size,
                            power_a)
    gen = torch.Generator().manual_seed(int(seed))
    b, n, u = num_examples, num_kv_pairs, num_updates
    half = vocab_size // 2
    num_values = vocab_size - half
    keys = sample_distinct(b, n, 1, half, gen)
    first_values = sample_distinct(b, n, half, vocab_size, gen)
    updated = sample_distinct(b, u, 0, n, gen)  # (b, u) indices of the reassigned keys
    # uniform over the other num_values - 1 values: shift the first value by 1..num_values-1
    shift = torch.randint(1, num_values, (b, u), generator=gen)
    new_values = half + (first_values.gather(1, updated) - half + shift) % num_values
    last_values = first_values.scatter(1, updated, new_values)

    context = 2 * (n + u)
    slots = sample_query_slots(b, (seq_len - context) // 2, n, power_a, gen)
    query_pos = context + 2 * slots

    inputs = background(b, seq_len, vocab_size, random_non_queries, gen)
    inputs[:, 0:2 * n:2] = keys
    inputs[:, 1:2 * n:2] = first_values
    inputs[:, 2 * n:context:2] = keys.gather(1, updated)
    inputs[:, 2 * n + 1:context:2] = new_values
    return inputs, place_queries(inputs, query_pos, keys, last_values)
