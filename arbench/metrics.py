"""Recall accuracy per example: zoology's ``valid/accuracy``.

``val/acc`` counts every answer token once, so a slice's weight is its number of answers (the
1024-token, 256-pair slice of the BASED-paper test set holds half of them). zoology averages
each example's accuracy over its answers first, then over examples, so slices of equal size
weigh the same. :func:`example_accuracy` gives the per-example values that metric averages.
"""

from __future__ import annotations

import torch


def example_accuracy(correct: torch.Tensor, rows: torch.Tensor, num_examples: int) -> torch.Tensor:
    """Each example's share of correct answers.

    ``correct`` ``(k,)``: 1.0 where the answer at a scored position is right; ``rows`` ``(k,)``:
    the example (``0 … num_examples-1``) each position belongs to. Returns ``(e,)`` float32,
    one value per example that has at least one scored position (examples without any are left
    out: they have no accuracy), in example order.
    """
    correct = correct.float()
    hits = torch.zeros(num_examples, dtype=torch.float32, device=correct.device)
    counts = torch.zeros(num_examples, dtype=torch.float32, device=correct.device)
    hits.index_add_(0, rows, correct)
    counts.index_add_(0, rows, torch.ones_like(correct))
    scored = counts > 0
    return hits[scored] / counts[scored]
