"""The recall tasks a data segment can select (``Segment.task``): each one's generator, the
check of its arguments, the settings it takes and how its slices are named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from arbench.data.copying import generate_selective_copying, validate_selective_copying_args
from arbench.data.incontext import (
    generate_in_context_recall,
    validate_in_context_recall_args,
)
from arbench.data.mqar import generate_mqar, validate_mqar_args
from arbench.data.overwrite import generate_overwrite, validate_overwrite_args


@dataclass(frozen=True)
class Task:
    """A recall task as segments select it: its generator, the generator's argument check, the
    segment settings it takes, the prefix of its slice names, whether it places queries at
    power-law gaps (so takes the data module's ``power_a`` and ``random_non_queries``), and the
    version of its generator's output: raised when the same arguments come to give other data,
    so data caches made before do not stand in for it."""

    generate: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    validate: Callable[..., None]
    settings: tuple[str, ...]
    prefix: str
    query_gaps: bool
    version: int = 1


TASKS: dict[str, Task] = {
    "mqar": Task(generate_mqar, validate_mqar_args, ("num_kv_pairs",), "", True),
    "overwrite": Task(generate_overwrite, validate_overwrite_args,
                      ("num_kv_pairs", "num_updates"), "ow_", True),
    "noisy_recall": Task(generate_in_context_recall, validate_in_context_recall_args,
                         ("noise_fraction", "noise_vocab_size"), "noisy_", False),
    "fuzzy_recall": Task(generate_in_context_recall, validate_in_context_recall_args,
                         ("max_key_len", "max_value_len"), "fuzzy_", False),
    # version 2: MAD's placement of the blanks (none after the last content token)
    "selective_copying": Task(generate_selective_copying, validate_selective_copying_args,
                              ("num_tokens_to_copy",), "copy_", False, version=2),
}
"""Task name (``Segment.task``) -> :class:`Task`."""

SETTING_TAGS = {"num_kv_pairs": "N", "num_updates": "U", "noise_fraction": "F",
                "noise_vocab_size": "NV", "max_key_len": "K", "max_value_len": "V",
                "num_tokens_to_copy": "T"}
"""Each task setting's tag in slice names (``L<seq_len>`` then ``<tag><value>`` per setting)."""
