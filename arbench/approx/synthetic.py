"""Synthetic queries and keys with a known structure, one set of statistics per "layer".

Layer i draws q = (μ_q + z D_i) R_q and k = (μ_k + z' D_i) R_k with z, z' standard normal,
a power-law spectrum D_i = diag(j^(−α_i)) (α falls with i, so later layers are flatter and
harder to compress), mean offsets μ of norm 1 and random rotations R.
"""

from __future__ import annotations

import torch

from arbench.approx.qkset import QKSet


def _rotation(d: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen))
    return q


def synthetic_qk(layers: list[int], head_dim: int = 16, num_seqs: int = 8, seq_len: int = 64,
                 num_heads: int = 1, seed: int = 0, train_seqs: int = 0) -> QKSet:
    """A :class:`QKSet` ``(len(layers), num_heads, num_seqs + train_seqs, seq_len,
    head_dim)``; the last ``train_seqs`` sequences are training-only (``train_only``)."""
    if head_dim < 1 or num_seqs < 1 or seq_len < 1 or num_heads < 1 or train_seqs < 0:
        raise ValueError("head_dim, num_seqs, seq_len and num_heads must be >= 1, "
                         "train_seqs >= 0")
    total = num_seqs + train_seqs
    gen = torch.Generator().manual_seed(seed)
    n_layers = len(layers)
    shape = (n_layers, num_heads, total, seq_len, head_dim)
    alphas = torch.linspace(1.0, 0.25, n_layers) if n_layers > 1 else torch.tensor([0.6])
    q = torch.empty(shape)
    k = torch.empty(shape)
    for i, alpha in enumerate(alphas.tolist()):
        spectrum = torch.arange(1, head_dim + 1, dtype=torch.float32).pow(-alpha)
        for h in range(num_heads):
            for out in (q, k):
                mean = torch.randn(head_dim, generator=gen)
                mean = mean / mean.norm()
                z = torch.randn(total, seq_len, head_dim, generator=gen) * spectrum
                out[i, h] = (z + mean) @ _rotation(head_dim, gen)
    meta = {"source": "synthetic", "layers": list(layers), "heads": list(range(num_heads)),
            "config": {"head_dim": head_dim, "num_seqs": num_seqs, "train_seqs": train_seqs,
                       "seq_len": seq_len,
                       "alphas": [round(a, 4) for a in alphas.tolist()], "seed": seed},
            "checkpoint": None}
    return QKSet(q, k, list(layers), list(range(num_heads)), meta, train_only=train_seqs)
