"""Mixtures of recall segments, each one slice of one task, served in batches.

Every batch holds examples of one segment only (no padding), and carries the index of its slice,
so accuracy can be reported per slice (e.g. ``L64_N8`` for MQAR, ``ow_L64_N8_U4`` for overwrite).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import NotRequired, TypedDict

import torch
from torch.utils.data import Dataset

from arbench.checks import check_int
from arbench.data.tasks import SETTING_TAGS, TASKS


@dataclass(frozen=True)
class Segment:
    """One slice of a mixture: ``num_examples`` sequences of ``seq_len`` tokens of ``task``.

    ``task`` names an entry of :data:`TASKS`; the settings it takes are required and the others
    must stay unset: ``mqar`` takes ``num_kv_pairs``, ``overwrite`` ``num_kv_pairs`` and
    ``num_updates``, ``noisy_recall`` ``noise_fraction`` and ``noise_vocab_size``,
    ``fuzzy_recall`` ``max_key_len`` and ``max_value_len``, ``selective_copying``
    ``num_tokens_to_copy`` (see each generator's module). :func:`check_segment` says which is
    wrong.
    """

    seq_len: int
    num_kv_pairs: int | None = None
    num_examples: int | None = None
    task: str = "mqar"
    num_updates: int | None = None
    noise_fraction: float | None = None
    noise_vocab_size: int | None = None
    max_key_len: int | None = None
    max_value_len: int | None = None
    num_tokens_to_copy: int | None = None

    @property
    def name(self) -> str:
        """Slice name: the task's prefix, ``L<seq_len>``, then each setting, e.g. ``L64_N8``,
        ``ow_L256_N32_U8``, ``noisy_L128_F0.2_NV16``, ``copy_L256_T16``."""
        tags = [f"{SETTING_TAGS[k]}{getattr(self, k)}" for k in TASKS[self.task].settings]
        return TASKS[self.task].prefix + "_".join([f"L{self.seq_len}", *tags])

    def settings(self) -> dict[str, int | float | str]:
        """The fields that are set: what generates this segment's data. A ``mqar`` segment gives
        ``{seq_len, num_kv_pairs, num_examples}`` alone, as before tasks existed (cache keys
        of MQAR data are unchanged)."""
        out = {k: v for k, v in vars(self).items() if v is not None}
        if self.task == "mqar":
            del out["task"]
        return out


class SegmentSpec(TypedDict):
    """A :class:`Segment` as a config file writes it: the keys that are set.

    The data module takes lists of these from the command line and config files because
    jsonargparse replaces such a list whole when a later file or flag gives one, where it would
    merge a list of dataclasses into the earlier list item by item (a segment would keep a
    ``task`` or setting of the one it replaces).
    """

    seq_len: int
    num_examples: int
    task: NotRequired[str]
    num_kv_pairs: NotRequired[int | None]
    num_updates: NotRequired[int | None]
    noise_fraction: NotRequired[float | None]
    noise_vocab_size: NotRequired[int | None]
    max_key_len: NotRequired[int | None]
    max_value_len: NotRequired[int | None]
    num_tokens_to_copy: NotRequired[int | None]


def as_segment(item: Segment | Mapping[str, object]) -> Segment:
    """``item`` itself if a :class:`Segment`, else the segment a :class:`SegmentSpec` writes;
    ``ValueError`` names a key that is not a segment setting."""
    if isinstance(item, Segment):
        return item
    unknown = sorted(set(item) - {f.name for f in fields(Segment)})
    if unknown:
        raise ValueError(f"{unknown[0]} is not a segment setting")
    return Segment(**item)  # type: ignore[arg-type]


def check_segment(seg: Segment, vocab_size: int, power_a: float) -> None:
    """Raise ``ValueError`` (one line) for an unknown task, a setting the task does not take or
    lacks, or settings its generator cannot meet."""
    if seg.task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {seg.task!r}")
    task = TASKS[seg.task]
    for key in SETTING_TAGS:
        value = getattr(seg, key)
        if key in task.settings and value is None:
            raise ValueError(f"task {seg.task} needs {key} (it takes {', '.join(task.settings)})")
        if key not in task.settings and value is not None:
            raise ValueError(f"{key} does not apply to task {seg.task} (it takes "
                             f"{', '.join(task.settings)})")
    task.validate(**_arguments(seg, vocab_size, power_a, random_non_queries=None))


def _arguments(seg: Segment, vocab_size: int, power_a: float,
               random_non_queries: bool | None) -> dict[str, object]:
    """Keyword arguments of the task's generator (its check when ``random_non_queries`` is
    None), without the seed."""
    task = TASKS[seg.task]
    args: dict[str, object] = dict(num_examples=seg.num_examples, seq_len=seg.seq_len,
                                   vocab_size=vocab_size,
                                   **{k: getattr(seg, k) for k in task.settings})
    if task.query_gaps:
        args["power_a"] = power_a
        if random_non_queries is not None:
            args["random_non_queries"] = random_non_queries
    return args


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
    """Generate every segment of a mixture, each by its task's generator with its own derived
    seed (:func:`segment_seed`)."""
    return [
        SegmentData(seg, *TASKS[seg.task].generate(
            **_arguments(seg, vocab_size, power_a, random_non_queries),
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
