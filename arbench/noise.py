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

Sweeps (:func:`quiet_sweep_noise`, :func:`quiet_lightning_loggers`) also drop Optuna's
``ExperimentalWarning`` (trial heartbeats are experimental) and its INFO log lines, its note
that a categorical choice is a list (a grid value that is a list of config files is stored
as JSON all the same), the trainer-construction and data-loader-workers hints Lightning gives
every trial, and Lightning's INFO/WARNING log lines: a sweep prints one line per trial.

Every process-wide warning filter of arbench and its sweeps is set here.
"""

from __future__ import annotations

import logging
import warnings

_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader",
    r"Precision bf16-mixed is not supported by the model summary",
)
_SWEEP_WARNINGS = (
    r"Choices for a categorical distribution should",
    r".*args parameter is intended",
    r".*does not have many workers.*",
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


def quiet_sweep_noise() -> None:
    """Install the sweep's filters (see above) and :func:`quiet_known_noise`; no Lightning
    import, so ``sweeps status`` and ``report`` stay quick."""
    import optuna  # here: main.py never needs Optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for pattern in _SWEEP_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    quiet_known_noise()


def quiet_lightning_loggers() -> None:
    """Lightning's loggers at ERROR: trials print one line each."""
    import lightning.pytorch  # noqa: F401  (here: configures its loggers on import; override after)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
