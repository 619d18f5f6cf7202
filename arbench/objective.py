"""The metrics a run is judged by, read back from what it recorded (no torch, no Lightning).

A run's ``summary.json`` and the user attributes a sweep records on its trial hold the same
keys: ``val_acc`` and ``slices`` (per answer token, at the best ``val/acc`` validation) and
``example_acc`` and ``example_slices`` (zoology's per-example metric, at its own best
validation). :func:`summary_value` reads any objective a spec may name from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ACC = "val/acc"
"""The mean over answer tokens, arbench's default objective."""
EXAMPLE_ACC = "val/example_acc"
"""zoology's metric (:mod:`arbench.metrics`), logged beside ``val/acc``."""


def summary_value(summary: Mapping[str, Any], metric: str) -> float | None:
    """The value of ``metric`` that a ``summary.json`` payload (or a trial's user attributes)
    holds: ``val/acc`` (the best), ``val/example_acc`` (its best), or a slice's,
    ``val/acc_<slice>`` / ``val/example_acc_<slice>`` (at the validation that was best on the
    overall metric); None when the run did not record it."""
    if metric == ACC:
        return summary.get("val_acc")
    if metric == EXAMPLE_ACC:
        return summary.get("example_acc")
    if metric.startswith(EXAMPLE_ACC + "_"):
        return (summary.get("example_slices") or {}).get(metric[len(EXAMPLE_ACC) + 1:])
    if metric.startswith(ACC + "_"):
        return (summary.get("slices") or {}).get(metric[len(ACC) + 1:])
    return None


__all__ = ["ACC", "EXAMPLE_ACC", "summary_value"]
