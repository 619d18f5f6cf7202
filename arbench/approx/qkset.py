"""Captured queries and keys of some (layer, head)s, and their .pt file format."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "arbench.approx.qk/1"


@dataclass
class QKSet:
    """Queries ``q`` and keys ``k``, each ``(L, H, S, n, d)``.

    L = ``len(layers)`` model layers (indices into ``model.blocks``), H = ``len(heads)`` heads,
    S sequences of n positions, head dim d. ``meta``: where they came from (layer, head,
    config dict, checkpoint path, data settings), plain Python values only. The last
    ``train_only`` of the S sequences may only train, never be held out (extra training data,
    :func:`arbench.approx.study.split_pairs`).
    """

    q: torch.Tensor
    k: torch.Tensor
    layers: list[int]
    heads: list[int]
    meta: dict[str, Any] = field(default_factory=dict)
    train_only: int = 0

    def __post_init__(self) -> None:
        if self.q.dim() != 5 or self.q.shape != self.k.shape:
            raise ValueError(f"q and k must both be (layers, heads, seqs, n, d), got "
                             f"{tuple(self.q.shape)} and {tuple(self.k.shape)}")
        if self.q.shape[:2] != (len(self.layers), len(self.heads)):
            raise ValueError(f"q has {self.q.shape[0]} layers x {self.q.shape[1]} heads but "
                             f"layers={self.layers}, heads={self.heads}")
        if not 0 <= self.train_only < self.q.shape[2]:
            raise ValueError(f"train_only must be in [0, {self.q.shape[2]}) (some sequences "
                             f"must be left to hold out), got {self.train_only}")

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    def get(self, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` of one model layer and head, each ``(S, n, d)``."""
        i, j = self.layers.index(layer), self.heads.index(head)
        return self.q[i, j], self.k[i, j]

    def select(self, layers: list[int] | None = None,
               heads: list[int] | None = None) -> QKSet:
        """The subset for ``layers`` / ``heads`` (all when ``None``); unknown ones raise."""
        layers = list(self.layers if layers is None else layers)
        heads = list(self.heads if heads is None else heads)
        for name, asked, have in (("layer", layers, self.layers), ("head", heads, self.heads)):
            missing = [x for x in asked if x not in have]
            if missing:
                raise ValueError(f"{name} {missing[0]} is not in the saved extraction "
                                 f"(it holds {name}s {have})")
        li = [self.layers.index(x) for x in layers]
        hi = [self.heads.index(x) for x in heads]
        q = self.q[li][:, hi]
        k = self.k[li][:, hi]
        return QKSet(q, k, layers, heads, dict(self.meta), self.train_only)


def save_qk(qk: QKSet, path: str | Path) -> Path:
    """Write ``qk`` to ``path`` (a .pt file loadable with ``weights_only=True``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT, "q": qk.q, "k": qk.k, "layers": list(qk.layers),
                "heads": list(qk.heads), "meta": qk.meta,
                "train_only": qk.train_only}, path)
    return path


def load_qk(path: str | Path) -> QKSet:
    """Read a file written by :func:`save_qk`; a clear ``ValueError`` for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"query/key file {path} does not exist")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"cannot read query/key file {path}: {exc}") from exc
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{path} is not an arbench query/key extraction (format {FORMAT})")
    return QKSet(blob["q"], blob["k"], list(blob["layers"]), list(blob["heads"]),
                 dict(blob.get("meta", {})), int(blob.get("train_only", 0)))
