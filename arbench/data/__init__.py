"""Recall data: MQAR and its variants (overwrite, noisy and fuzzy in-context recall, selective
copying), each a seeded generator, and segment mixtures that select them by task."""

from arbench.data.copying import generate_selective_copying
from arbench.data.incontext import generate_in_context_recall
from arbench.data.mqar import IGNORE_INDEX, generate_mqar
from arbench.data.overwrite import generate_overwrite
from arbench.data.segments import Segment, SegmentBatches, SegmentData, generate_segments
from arbench.data.tasks import TASKS

__all__ = ["IGNORE_INDEX", "TASKS", "Segment", "SegmentBatches", "SegmentData",
           "generate_in_context_recall", "generate_mqar", "generate_overwrite",
           "generate_segments", "generate_selective_copying"]
