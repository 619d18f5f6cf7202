"""Verdicts on a run's curves: did it converge, did it collapse.

- **Converged**: val/acc (or, in the sweep reports, the study's objective) rose by less than
  :data:`CONVERGED_RISE` (1 point) over the last quarter of the run's steps (from the last
  validation at or before 3/4 of the final step to the final one), or it reached the
  early-stopping threshold (0.99). A curve that fell over its last quarter counts as converged:
  the verdict says whether more steps would raise the best validation the tables report, and
  a fall is flagged where it comes from a collapse of the training loss (below).
- **Collapsed at step N**: the training loss, smoothed over :data:`SMOOTH_STEPS` logged steps,
  first fell below :data:`COLLAPSE_LOW` (half) of its initial value and later climbed back above
  :data:`COLLAPSE_HIGH` (85%) of it; N is the step where it crossed back. The initial value is
  never taken below the loss of guessing at chance (ln vocab, when the caller knows the vocab):
  a warm-started run begins already trained, and its noise is not a collapse; a collapse is a
  return to guessing. For a run trained from scratch, whose first losses are about ln vocab,
  this changes nothing. A collapse is a status of its own, distinct from a run that learned
  little (whose loss never halved).
"""

from __future__ import annotations

from collections.abc import Sequence

CONVERGED_RISE = 0.01
STOP_THRESHOLD = 0.99
SMOOTH_STEPS = 25
COLLAPSE_LOW, COLLAPSE_HIGH = 0.5, 0.85

Curve = Sequence[tuple[int, float]]
"""``(step, value)`` pairs in step order."""


def is_converged(val: Curve, threshold: float = STOP_THRESHOLD,
                 rise: float = CONVERGED_RISE) -> bool | None:
    """The convergence verdict of a val/acc curve (None when there is no validation). A curve
    with no validation before its last one at or before 3/4 of its last step cannot show a
    plateau: False (also one validation at step 0). A NaN value reaches no threshold."""
    if not val:
        return None
    if any(acc >= threshold for _, acc in val):
        return True
    last_step, last = val[-1]
    before = [acc for step, acc in val[:-1] if step <= 0.75 * last_step]
    if not before:
        return False
    return last - before[-1] < rise


def smoothed(losses: Curve, window: int = SMOOTH_STEPS) -> list[tuple[int, float]]:
    """Trailing means over ``window`` values (fewer at the start), at each value's step."""
    out, total = [], 0.0
    for i, (step, value) in enumerate(losses):
        total += value
        if i >= window:
            total -= losses[i - window][1]
        out.append((step, total / min(i + 1, window)))
    return out


def significant(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits (a curve point as records keep it)."""
    return float(f"{value:.{digits}g}")


def block_means(values: Curve, block: int = SMOOTH_STEPS,
                digits: int = 4) -> list[tuple[int, float]]:
    """Means of ``values`` over consecutive blocks of ``block`` training steps (steps 1…block,
    block+1…2·block, …), each at the block's last step seen, rounded to ``digits`` significant
    digits: the compact training-loss curve a run's ``summary.json`` and its sweep record keep
    (one point per ``block`` steps, the density of the profiles' logged loss)."""
    out: list[tuple[int, float]] = []
    current, total, count, last = None, 0.0, 0, 0
    for step, value in values:
        index = (int(step) - 1) // block if step > 0 else 0
        if current is not None and index != current and count:
            out.append((last, significant(total / count, digits)))
            total, count = 0.0, 0
        current, last = index, int(step)
        total += value
        count += 1
    if count:
        out.append((last, significant(total / count, digits)))
    return out


def collapse_step(losses: Curve, window: int = SMOOTH_STEPS,
                  chance: float | None = None) -> int | None:
    """The step at which a training-loss curve collapsed (see the module docstring), or None.
    The initial value is the mean of the first ``window`` losses, or ``chance`` (the loss of a
    uniform guess, ln vocab, in nats) when that is larger."""
    if len(losses) < 2 * window:
        return None
    initial = max(sum(v for _, v in losses[:window]) / window, chance or 0.0)
    fell = False
    for step, value in smoothed(losses, window)[window:]:
        if value < COLLAPSE_LOW * initial:
            fell = True
        elif fell and value > COLLAPSE_HIGH * initial:
            return int(step)
    return None


__all__ = ["COLLAPSE_HIGH", "COLLAPSE_LOW", "CONVERGED_RISE", "SMOOTH_STEPS", "block_means",
           "collapse_step", "is_converged", "significant", "smoothed"]
