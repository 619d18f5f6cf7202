"""Selective copying: tokens scattered among blanks, then a copy marker; the model outputs the
tokens in their order. MAD's ``selective_copying`` semantics (athms/mad-lab,
``mad/data/instances.py``), vectorised and seeded.

Layout of one example copying ``T`` tokens, with ``B = seq_len - 2T - 1`` blanks among them::

    region of T + B tokens: the T content tokens in order, blanks between and before them
    | copy marker | T blanks (the answers: the content tokens in order)

Token 0 is the blank, ``vocab_size - 1`` the copy marker, content tokens are drawn uniformly
(with replacement) from ``[1, vocab_size - 1)``. As in MAD, each of the ``B`` blanks goes in
front of one of the ``T`` content tokens, chosen uniformly and independently (so the blanks
before each token are multinomial, ``B / T`` on average), and none after the last one: the
last content token always stands just before the marker. The label at the ``i``-th blank after
the marker is the ``i``-th content token; every other label is ``IGNORE_INDEX``. (MAD's ids
differ: its blank is ``vocab_size - 2`` and its content tokens ``[0, vocab_size - 2)``; the
same number of content tokens.)

Worked example (``num_examples=1, seq_len=12, num_tokens_to_copy=3, vocab_size=8, seed=0``;
``.`` is ``IGNORE_INDEX``)::

    inputs   0  0  3  0  0  0  4  6  7  0  0  0
    labels   .  .  .  .  .  .  .  .  .  3  4  6

(the region is the first 8 tokens, with 5 blanks: two before 3, three before 4, none before 6;
7 is the copy marker).
"""

from __future__ import annotations

import torch

from arbench.checks import check_int
from arbench.data.mqar import IGNORE_INDEX

BLANK = 0


def validate_selective_copying_args(num_examples: int, seq_len: int, num_tokens_to_copy: int,
                                    vocab_size: int) -> None:
    """Raise ``ValueError`` naming the argument and its limit for an impossible setting."""
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len),
                        ("num_tokens_to_copy", num_tokens_to_copy), ("vocab_size", vocab_size)):
        check_int(name, value)
    need = 2 * num_tokens_to_copy + 2
    if seq_len < need:
        raise ValueError(
            f"seq_len={seq_len} is too short for num_tokens_to_copy={num_tokens_to_copy}: the "
            f"tokens, one blank among them, the copy marker and the answers need "
            f"seq_len >= 2*num_tokens_to_copy+2={need}")
    if vocab_size < 3:
        raise ValueError(f"vocab_size={vocab_size} is too small: the blank and the copy marker "
                         f"leave no content token (vocab_size must be >= 3)")


def generate_selective_copying(num_examples: int, seq_len: int, num_tokens_to_copy: int,
                               vocab_size: int,
                               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate selective-copying examples (module docstring).

    Returns ``(inputs, labels)``, both ``torch.long`` of shape ``(num_examples, seq_len)``.
    Deterministic for given arguments (own ``torch.Generator``, global RNG untouched).
    """
    validate_selective_copying_args(num_examples, seq_len, num_tokens_to_copy, vocab_size)
    gen = torch.Generator().manual_seed(int(seed))
    b, t = num_examples, num_tokens_to_copy
    region = seq_len - t - 1
    content = torch.randint(1, vocab_size - 1, (b, t), generator=gen)
    gaps = torch.randint(0, t, (b, region - t), generator=gen)  # each blank: the token it precedes
    before = torch.zeros(b, t, dtype=torch.long).scatter_add_(1, gaps, torch.ones_like(gaps))
    places = torch.arange(t) + before.cumsum(dim=1)  # the last one is region - 1
    inputs = torch.full((b, seq_len), BLANK, dtype=torch.long)
    inputs.scatter_(1, places, content)
    inputs[:, region] = vocab_size - 1
    labels = torch.full((b, seq_len), IGNORE_INDEX, dtype=torch.long)
    labels[:, region + 1:] = content
    return inputs, labels
