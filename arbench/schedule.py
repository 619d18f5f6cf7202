"""Learning-rate schedules, as the factor of the base lr at each optimiser step.

- ``"cosine"`` (arbench's default): linear warm-up over ``warmup_steps`` (factor
  ``(step + 1) / warmup_steps``, 1 at the last warm-up step), then cosine decay that reaches
  ``min_lr_ratio`` at the last step taken, ``total_steps − 1`` (0-based).
- ``"zoology"``: zoology's ``CosineAnnealingLR(T_max=epochs, eta_min=0)`` stepped once per
  epoch: during epoch ``e`` of ``E`` the factor is ``(1 + cos(π e / E)) / 2``, constant within
  the epoch (so the last epoch of 32 trains at 0.0024 × lr); no warm-up. ``E`` is the number of
  epochs the run's steps span, ``ceil(total_steps / steps_per_epoch)``.
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("cosine", "zoology")


def lr_factor(schedule: str, step: int, total_steps: int, *, warmup_steps: int = 0,
              min_lr_ratio: float = 0.0, steps_per_epoch: int = 1) -> float:
    """The lr multiplier at optimiser step ``step`` (0-based) of ``total_steps``."""
    if schedule == "zoology":
        epochs = max(1, math.ceil(total_steps / steps_per_epoch))
        epoch = min(step // steps_per_epoch, epochs - 1)
        return 0.5 * (1 + math.cos(math.pi * epoch / epochs))
    if schedule != "cosine":
        raise ValueError(f"lr schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step + 1 - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
