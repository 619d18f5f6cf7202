"""Mixtures of MQAR segments, each of one ``(seq_len, num_kv_pairs)`` slice, served in batches.

Every batch holds examples of one segment only (no padding), and carries the index of its slice,
so accuracy can be reported per ``(seq_len, num_kv_pairs)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from arbench.checks import check_int
from arbench.data.mqar import generate_mqar


@dataclass(frozen=True)
class Segment:
    """One slice of a mixture: ``num_examples`` sequences of ``seq_len`` with ``num_kv_pairs``."""

    seq_len: int
    num_kv_pairs: int
    num_examples: int

    @property
    def name(self) -> str:
        return f"L{self.seq_len}_N{self.num_kv_pairs}"


@dataclass
class SegmentData:
    """Generated tensors of one segment: ``inputs`` and ``labels`` are ``(num_examples, seq_len)``."""

    segment: Segment
    inputs: torch.Tensor
    labels: torch.Tensor


def segment_seed(seed: int, split: str, index: int) -> int:
    """Seed of segment ``index`` of ``split``: independent of the other segments of the mixture."""
    salt = {"train": 1, "val": 2, "test": 3}.get(split, 4)
    return (int(seed) * 1_000_003 + salt * 10_007 + index) % (2**63 - 1)


def generate_segments(segments: list[Segment], vocab_size: int, seed: int, split: str,
                      power_a: float = 0.01, random_non_queries: bool = True) -> list[SegmentData]:
    """Generate every segment of a mixture with its own derived seed."""
    return [
        SegmentData(seg, *generate_mqar(seg.num_examples, seg.seq_len, seg.num_kv_pairs,
                                        vocab_size=vocab_size, power_a=power_a,
                                        random_non_queries=random_non_queries,
                                        seed=segment_seed(seed, split, i)))
        for i, seg in enumerate(segments)
    ]


class SegmentBatches(Dataset):
    """A dataset whose items are whole batches ``(inputs, labels, slice_index)``.

    ``inputs``/``labels`` are ``(batch, seq_len)``; ``slice_index`` is a 0-d long tensor naming
    the segment. Examples of each segment are grouped into batches after a seeded shuffle; the
    last batch of a segment may be smaller. Use with ``DataLoader(batch_size=None)``.
    """

    def __init__(self, data: list[SegmentData], batch_size: int, shuffle_seed: int | None = None):
        check_int("batch_size", batch_size)
        self.data = data
        self.batches: list[tuple[int, torch.Tensor]] = []
        gen = torch.Generator().manual_seed(shuffle_seed) if shuffle_seed is not None else None
        for slice_index, seg in enumerate(data):
            count = seg.inputs.shape[0]
            order = torch.randperm(count, generator=gen) if gen is not None else torch.arange(count)
            for start in range(0, count, batch_size):
                self.batches.append((slice_index, order[start:start + batch_size]))

    @property
    def slice_names(self) -> list[str]:
        return [d.segment.name for d in self.data]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        slice_index, idx = self.batches[i]
        seg = self.data[slice_index]
        return seg.inputs[idx], seg.labels[idx], torch.tensor(slice_index)
