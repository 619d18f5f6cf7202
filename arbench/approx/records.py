"""What an approximation study runs and what it records: :class:`StudyConfig` and
:class:`Record`, and the names of the rows that are not fitted methods."""

from __future__ import annotations

from dataclasses import dataclass, field

from arbench.approx.fit import FitConfig
from arbench.registry import MethodConfig

FLOOR = "Eckart–Young floor"
EXPLICIT = "Thm 3.1 W* (held-out)"
FITTED_OPTIMAL = "data limit: Thm 3.1 W* (train)"
METHOD_KEYS = ("polysketch", "mlp", "flatten", "based", "llops")


@dataclass(frozen=True)
class StudyConfig:
    """What to run: degrees ``ps``, feature dim ``m``, LLoPS ranks, sizes and the fit budget."""

    ps: tuple[int, ...] = (2, 3)
    m: int = 64
    ranks: tuple[int, ...] = (1, 2, 4, 8)
    fit: FitConfig = field(default_factory=FitConfig)
    lrs: tuple[float, ...] = ()  # several: keep the best (FitResult.selection_loss); (): fit.lr
    n_train: int = 2048
    n_test: int = 1024
    train_fraction: float = 0.5
    seed: int = 0
    mlp_hidden: int = 256
    explicit_max_dim: int = 20_000
    methods: tuple[str, ...] = METHOD_KEYS
    method_configs: tuple[MethodConfig, ...] = ()  # fitted beside ``methods``
    val_seqs: int = 0  # last: arbench.approx.ledger.ADDED_LATER; see study.split_pairs


@dataclass
class Record:
    """One score: method at degree p on one (layer, head), on the held-out pairs."""

    p: int
    method: str
    layer: int
    head: int
    rmae: float
    rel_frobenius: float
    feature_dim: int
    seconds: float = 0.0
    detail: str = ""
    fit_start: str = ""  # "adam", "als" (from projection r=…) or "svd", and how it ended
    fit_steps: int = 0  # Adam steps or ALS sweeps of the start
    polish_steps: int = 0  # full-batch L-BFGS steps after it
    fit_stop: str = ""  # why the fit ended (the polish's rule when it ran)
    grad_norm: float | None = None  # ‖∇L‖₂ of the training loss at the stop
    machine: str = ""  # the CPU (or GPU) that computed it (arbench.machine); "" before 2026-12-06
