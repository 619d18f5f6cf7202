"""Silence the library messages a normal run prints that are not about the user's run.

Each filter matches one known message, so every other warning still shows:

- torch's ``isinstance(treespec, LeafSpec)`` deprecation, raised inside Lightning;
- Lightning's "💡 Tip: ... litlogger" advert;
- Lightning's "Precision bf16-mixed is not supported by the model summary … Using 32 bits
  instead": under bf16-mixed the weights stay fp32, so the summary's size is right;
- Lightning's "dataloader is not resumable" on a resume: the README says what a resume does to
  the data order instead (the interrupted epoch's order starts again from its beginning);
- Lightning's "Checkpoint directory … exists and is not empty", on a resume only
  (:func:`quiet_resume_warning`): a resume writes into the folder it resumes from, by design,
  while a fresh run into a used folder still hears it;
- Lightning's "The dirpath has changed from …" when ``validate`` or ``test`` loads a checkpoint
  from another folder (:func:`quiet_evaluation_dirpath_warning`): neither saves checkpoints,
  so the checkpoint callback's state it drops is never used.
"""

from __future__ import annotations

import logging
import warnings

_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader",
    r"Precision bf16-mixed is not supported by the model summary",
)
_LOG_MESSAGES = ("litlogger",)
_RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"


class _DropMessages(logging.Filter):
    """Drops log records whose message contains one of ``needles``."""

    def __init__(self, needles: tuple[str, ...]):
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(needle in message for needle in self.needles)


def quiet_known_noise() -> None:
    """Install the filters above (idempotent)."""
    for pattern in _WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    logger = logging.getLogger(_RANK_ZERO_LOGGER)
    if not any(isinstance(f, _DropMessages) for f in logger.filters):
        logger.addFilter(_DropMessages(_LOG_MESSAGES))


def quiet_resume_warning() -> None:
    """Silence "Checkpoint directory … exists and is not empty": call it only when resuming."""
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not")


def quiet_evaluation_dirpath_warning() -> None:
    """Silence "The dirpath has changed from …": call it only for ``validate`` and ``test``."""
    warnings.filterwarnings("ignore", message="The dirpath has changed from")
