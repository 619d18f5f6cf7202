"""MQAR data: the generator and segment mixtures."""

from arbench.data.mqar import IGNORE_INDEX, generate_mqar
from arbench.data.segments import Segment, SegmentBatches, SegmentData, generate_segments

__all__ = ["IGNORE_INDEX", "Segment", "SegmentBatches", "SegmentData", "generate_mqar",
           "generate_segments"]
