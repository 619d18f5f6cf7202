"""Benchmark of one attention layer per method (feature maps + causal attention) and of a
RecallModel training step: times, achieved FLOP/s, peak memory, target checks.

Run ``python -m arbench.bench`` (``--help`` for the options, ``--smoke`` for a seconds-long
run); ``run_benchmark(BenchConfig(...))`` does the same from Python.
"""

from arbench.bench.config import BenchConfig, TrainSpec, smoke_config
from arbench.bench.run import run_benchmark

__all__ = ["BenchConfig", "TrainSpec", "run_benchmark", "smoke_config"]
