"""Wall-clock timing: synchronised calls, interleaved rounds, the matmul reference throughput."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch


def synchronize(device: str) -> None:
    """Wait for queued kernels on ``device`` (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], None], device: str, inner: int = 1) -> float:
    """Seconds per call of ``fn``, averaged over ``inner`` back-to-back calls."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / inner


@dataclass
class Case:
    """One timed case: ``key`` (e.g. (method, n, pass)), its closure and samples (seconds)."""

    key: Hashable
    fn: Callable[[], None]
    inner: int = 1
    samples: list[float] = field(default_factory=list)


def warm_up(case: Case, device: str, min_sample_s: float) -> None:
    """Run ``case`` once (one-time costs) and, when that call was shorter than ``min_sample_s``,
    once more timed, to pick ``inner`` so that a sample lasts at least ``min_sample_s``."""
    once = time_call(case.fn, device)
    if once < min_sample_s:
        once = time_call(case.fn, device)
    case.inner = max(1, math.ceil(min_sample_s / max(once, 1e-9)))


def round_robin(groups: Sequence[Sequence[Case]], repeats: int, device: str,
                first_round: int = 0) -> None:
    """Time every case ``repeats`` times; within a round, each group's cases run back to back,
    in an order rotated by one every round (round r starts at case r mod len(group))."""
    for rep in range(first_round, first_round + repeats):
        for group in groups:
            shift = rep % max(len(group), 1)
            for case in [*group[shift:], *group[:shift]]:
                case.samples.append(time_call(case.fn, device, case.inner))


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``samples`` (seconds)."""
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def matmul_case(device: str, size: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                name: str = "") -> Case:
    """A ``size × size`` matmul of two seeded normal matrices in ``dtype`` as a :class:`Case`
    (key ``("matmul", name)``): the matmul reference, timed alone (:func:`matmul_throughput`)
    or in the same interleaved rounds as the cases it is the reference of, so that both see the
    same machine."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=gen).to(device, dtype)
    b = torch.randn(size, size, generator=gen).to(device, dtype)
    return Case(("matmul", name), lambda: torch.mm(a, b))


def case_throughput(case: Case, size: int) -> dict[str, float]:
    """GFLOP/s (median, min, max over its samples; ``2·size³`` FLOPs a call) of a
    :func:`matmul_case` that has been timed; ``samples`` is how many."""
    rates = [2.0 * size ** 3 / t / 1e9 for t in case.samples]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "size": size, "samples": len(rates)}


def matmul_throughput(device: str, size: int, repeats: int, seed: int = 0,
                      dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Throughput of ``size × size`` matmuls in ``dtype`` (GFLOP/s: median, min, max over
    ``repeats``, :func:`case_throughput`), timed alone; the first two products are warm-up."""
    case = matmul_case(device, size, seed, dtype)
    case.fn(), case.fn()
    case.samples = [time_call(case.fn, device) for _ in range(repeats)]
    return {**case_throughput(case, size), "repeats": repeats}
