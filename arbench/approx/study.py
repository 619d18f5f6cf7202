"""The approximation study: split, normalise, floor, fit every method, score on held-out pairs.

Per (layer, head) and p: queries and keys of the training sequences train the fitted maps on
all their (query, key) pairs; the held-out matrix A = (Q_test K_testᵀ)^p of the other
sequences scores every method and gives the Eckart–Young floor. q and k are both divided by
√c, c = RMS of q·k over the training pairs, so (q·k)^p is O(1) for every p; the relative
metrics of the polynomial maps and the floor do not depend on this scale.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from arbench.approx.fit import FitResult, fit_best
from arbench.approx.floor import eckart_young, explicit_sketch_kernel, fitted_optimal_sketch
from arbench.approx.ledger import Ledger
from arbench.approx.methods import method_builders
from arbench.approx.metrics import rel_frobenius, rmae
from arbench.approx.qkset import QKSet
from arbench.approx.records import (
    EXPLICIT,
    FITTED_OPTIMAL,
    FLOOR,
    METHOD_KEYS,
    Record,
    StudyConfig,
)
from arbench.approx.starts import LLOPS_STARTS
from arbench.approx.target import check_p, monomial_count, poly_kernel
from arbench.checks import check_int
from arbench.machine import device_name

Log = Callable[[str], None]

@dataclass
class Split:
    """Normalised training and held-out queries/keys, each ``(n, d)``; ``scale`` = c; with
    ``val_seqs``, the validation queries/keys ``(n_val, d)`` (else ``None``)."""

    q_train: torch.Tensor
    k_train: torch.Tensor
    q_test: torch.Tensor
    k_test: torch.Tensor
    scale: float
    q_val: torch.Tensor | None = None
    k_val: torch.Tensor | None = None


def check_val_seqs(val_seqs: int, train_only: int) -> None:
    """Raise ``ValueError`` (one line) unless ``val_seqs`` ≤ the training-only sequences."""
    if val_seqs > train_only:
        raise ValueError(f"--val-seqs {val_seqs} needs as many training-only sequences "
                         f"(--train-seqs), got {train_only}")


def split_sizes(num_seqs: int, seq_len: int, config: StudyConfig,
                train_only: int = 0) -> tuple[int, int, int]:
    """``(train sequences, train tokens, held-out tokens)`` the split will use.

    The first ``num_seqs − train_only`` sequences are split (``train_fraction`` train, the
    rest held out); the last ``train_only`` add to the training ones, less the last
    ``config.val_seqs`` of them, which are validation sequences.
    """
    base = num_seqs - train_only
    if base < 2:
        raise ValueError(f"need at least 2 sequences besides the training-only ones to hold "
                         f"some out, got {base}")
    check_val_seqs(config.val_seqs, train_only)
    extra = train_only - config.val_seqs
    s_train = min(max(1, round(base * config.train_fraction)), base - 1)
    return (s_train + extra, min(config.n_train, (s_train + extra) * seq_len),
            min(config.n_test, (base - s_train) * seq_len))


def pair_scale(q: torch.Tensor, k: torch.Tensor) -> float:
    """c = RMS of q·k over all ``(nq, d)`` × ``(nk, d)`` pairs, via ‖Q Kᵀ‖²_F = tr(QᵀQ KᵀK)."""
    q64, k64 = q.double(), k.double()
    return float(((q64.T @ q64) * (k64.T @ k64)).sum().clamp_min(0) / (len(q) * len(k))) ** 0.5


def split_pairs(q: torch.Tensor, k: torch.Tensor, config: StudyConfig,
                train_only: int = 0) -> Split:
    """Split ``(S, n, d)`` queries/keys by sequence, subsample tokens (seeded), normalise.

    The held-out tokens are drawn from the first ``S − train_only`` sequences exactly as
    without training-only ones; the training tokens are that split's (in its seeded order)
    followed by the training-only sequences' (own seeded order), cut to ``n_train``. With
    ``config.val_seqs`` = v > 0 the last v training-only sequences train nothing: all their
    tokens are the validation queries/keys, disjoint by sequence from the training and the
    held-out ones, as the held-out ones are from the training ones.
    """
    s, n, d = q.shape
    base, v = s - train_only, config.val_seqs
    _, n_train, n_test = split_sizes(s, n, config, train_only)
    s_train, _, _ = split_sizes(base, n, replace(config, val_seqs=0))
    gen = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(base, generator=gen)
    tr, te = order[:s_train], order[s_train:]

    def tokens(x: torch.Tensor, seqs: torch.Tensor, count: int, pick: torch.Tensor) -> torch.Tensor:
        return x[seqs].reshape(-1, d)[pick[:count]].float()

    pick_tr = torch.randperm(s_train * n, generator=gen)
    pick_te = torch.randperm((base - s_train) * n, generator=gen)
    q_tr, k_tr = tokens(q, tr, n_train, pick_tr), tokens(k, tr, n_train, pick_tr)
    q_te, k_te = tokens(q, te, n_test, pick_te), tokens(k, te, n_test, pick_te)
    more = n_train - q_tr.shape[0]
    if more > 0:
        extra = torch.arange(base, s - v)
        pick_x = torch.randperm((train_only - v) * n, generator=torch.Generator().manual_seed(
            config.seed + 1))
        q_tr = torch.cat([q_tr, tokens(q, extra, more, pick_x)])
        k_tr = torch.cat([k_tr, tokens(k, extra, more, pick_x)])
    c = pair_scale(q_tr, k_tr)
    if not math.isfinite(c) or c <= 0:
        raise ValueError("queries and keys are degenerate: q·k is zero (or not finite) on all "
                         "training pairs")
    root = math.sqrt(c)
    split = Split(q_tr / root, k_tr / root, q_te / root, k_te / root, c)
    if v:
        held = torch.arange(s - v, s)
        split.q_val = q[held].reshape(-1, d).float() / root
        split.k_val = k[held].reshape(-1, d).float() / root
    return split


def check_settings(config: StudyConfig) -> None:
    """Raise ``ValueError`` (one line) for p < 1, a bad m, rank, method or fit setting."""
    if not config.ps:
        raise ValueError("no degree p given")
    for p in config.ps:
        check_p(p)
    check_int("m", config.m)
    check_int("--val-seqs", config.val_seqs, minimum=0)
    for t in config.ranks:
        check_int("every LLoPS rank t", t)
    unknown = [x for x in config.methods if x not in METHOD_KEYS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {list(METHOD_KEYS)}")
    fit = config.fit
    if fit.steps < 0 or fit.batch < 1 or config.n_train < 1 or config.n_test < 1:
        raise ValueError("steps must be >= 0 and batch, n_train, n_test >= 1")
    if fit.check_every < 1 or fit.patience < 1 or fit.lr_drops < 0 or \
            not 0 <= fit.min_improvement < 1:
        raise ValueError("check_every and patience must be >= 1, lr_drops >= 0 and "
                         "min_improvement in [0, 1)")
    if fit.start.sweeps < 0 or fit.start.cg_iters < 1 or not 0 <= fit.start.tol < 1:
        raise ValueError("ALS sweeps must be >= 0, its CG steps >= 1 and its tol in [0, 1)")
    if fit.start.llops_from not in LLOPS_STARTS:
        raise ValueError(f"unknown LLoPS start {fit.start.llops_from!r}; choose from "
                         f"{list(LLOPS_STARTS)}")
    if fit.polish.steps < 0 or fit.polish.patience < 1 or fit.polish.history < 1 or \
            not fit.polish.gtol >= 0 or not 0 <= fit.polish.ftol < 1:
        raise ValueError("L-BFGS steps must be >= 0, gtol >= 0 and ftol in [0, 1)")
    if any(not lr > 0 for lr in (config.lrs or (fit.lr,))):
        raise ValueError(f"learning rates must be > 0, got {list(config.lrs or (fit.lr,))}")


def check_config(config: StudyConfig, qk: QKSet) -> None:
    """:func:`check_settings`, and m no larger than the held-out queries/keys of ``qk``."""
    check_settings(config)
    _, _, n_test = split_sizes(qk.q.shape[2], qk.q.shape[3], config, qk.train_only)
    if config.m > n_test:
        raise ValueError(f"m={config.m} is larger than the number of held-out queries/keys "
                         f"({n_test}): the held-out {n_test}x{n_test} matrix has rank <= "
                         f"{n_test}, so the floor would be trivially 0; lower m or hold out more")


def _score(p: int, method: str, layer: int, head: int, approx: torch.Tensor, a: torch.Tensor,
           feature_dim: int, seconds: float = 0.0, detail: str = "") -> Record:
    return Record(p, method, layer, head, rmae(approx, a), rel_frobenius(approx, a),
                  feature_dim, seconds, detail, machine=device_name(approx.device))


def floor_records(split: Split, p: int, layer: int, head: int,
                  config: StudyConfig) -> list[Record]:
    """Eckart–Young floor, explicit W* on the held-out set, and W* built on the train split."""
    m = config.m
    a = poly_kernel(split.q_test.double(), split.k_test.double(), p)
    floor = eckart_young(a, m)
    out = [Record(p, FLOOR, layer, head, floor.rmae, floor.rel_frobenius, m,
                  machine=device_name(a.device))]
    explicit = explicit_sketch_kernel(split.q_test, split.k_test, p, m, config.explicit_max_dim)
    if explicit is not None:
        dim = monomial_count(split.q_test.shape[1], p)
        out.append(_score(p, EXPLICIT, layer, head, explicit, a, m, detail=f"ψ_p dim {dim}"))
    phi_q, phi_k = fitted_optimal_sketch(split.q_train, split.k_train, p, m)
    approx = phi_q(split.q_test.double()) @ phi_k(split.k_test.double()).T
    out.append(_score(p, FITTED_OPTIMAL, layer, head, approx, a, m))
    return out


def fit_summary(result: FitResult) -> str:
    """One log phrase: the start (lr and steps for Adam), then the polish and its stop."""
    if result.start.startswith("adam"):
        start = f"{result.start}: lr {result.lr:g}, {result.steps} steps"
    else:
        start = f"{result.start}: {result.steps} sweeps" if result.steps else result.start
    if not result.polish_steps and not math.isfinite(result.grad_norm):
        return start
    return (f"{start}; L-BFGS {result.polish_steps} steps ({result.stopped}), "
            f"|grad| {result.grad_norm:.2g}")


PROGRESS_SECONDS = 60.0
"""With ``--log-every 0`` a fit still prints its latest step or sweep line this often."""


class Progress:
    """A log of a fit's per-step and per-sweep lines that passes one on only once
    ``interval`` seconds of wall time have passed since the fit began or since the last one
    passed (short fits, e.g. in tests, print nothing). It only prints lines the fit writes
    from values it has computed anyway: no extra draw or evaluation, so no number changes."""

    def __init__(self, log: Log, interval: float | None = None) -> None:
        self.log = log
        self.interval = PROGRESS_SECONDS if interval is None else interval
        self.began = self.last = time.monotonic()

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.log(f"{line} ({now - self.began:.0f} s into the fit)")


def method_records(split: Split, p: int, layer: int, head: int, config: StudyConfig,
                   log: Log | None = None, floor_fro: float | None = None,
                   ledger: Ledger | None = None) -> list[Record]:
    """Build (seeded), fit on the train split and score every selected method; a method whose
    record ``ledger`` already holds is taken from it, and each new record is added to it."""
    d = split.q_train.shape[1]
    a = poly_kernel(split.q_test.double(), split.k_test.double(), p)
    out = []
    for key, name, build in method_builders(d, config.m, p, list(config.ranks), config.seed,
                                            config.mlp_hidden, config.method_configs):
        if key not in (*config.methods, "config"):
            continue
        tag = f"[L{layer} h{head} p={p}] {name}"
        stored = ledger.get((layer, head, p, name)) if ledger else None
        if stored is not None:
            out.append(stored)
            if log:
                log(f"{tag}: from {ledger.path}, held-out RMAE {stored.rmae:.4f}")
            continue
        val = None if split.q_val is None else (split.q_val, split.k_val)
        fit, fit_log = config.fit, log
        if log and not fit.log_every:  # no per-step lines asked for: one a minute
            fit, fit_log = replace(fit, log_every=1), Progress(log)
        fitted = fit_best(build, split.q_train, split.k_train, lambda x, y: poly_kernel(x, y, p),
                          fit, config.lrs or (config.fit.lr,), fit_log, tag, val)
        if fitted is None:
            if log:
                log(f"{tag}: skipped (no r with C(r+p-1, p) <= m={config.m})")
            continue
        pair, result = fitted
        tag += f" ({pair.detail})" if pair.detail else ""
        with torch.no_grad():
            approx = pair(split.q_test, split.k_test)
        rec = _score(p, name, layer, head, approx, a, pair.feature_dim, result.seconds,
                     pair.detail)
        rec.fit_start, rec.fit_steps, rec.fit_stop = result.start, result.steps, result.stopped
        rec.polish_steps = result.polish_steps
        rec.grad_norm = result.grad_norm if math.isfinite(result.grad_norm) else None
        out.append(rec)
        if ledger:
            ledger.add(rec)
        if log:
            how = (f"{fit_summary(result)}, loss {result.first_loss:.3g} -> "
                   f"{result.last_loss:.3g}, " if pair.fitted else "not fitted, ")
            floor = f" (floor {floor_fro:.4f})" if floor_fro is not None else ""
            log(f"{tag}: {how}held-out RMAE {rec.rmae:.4f}, rel. Frobenius "
                f"{rec.rel_frobenius:.4f}{floor}, {result.seconds:.1f} s")
    return out


def run_study(qk: QKSet, config: StudyConfig, log: Log | None = None,
              ledger: Ledger | None = None) -> list[Record]:
    """Every (layer, head) × p × method of ``config`` on ``qk``; the records in run order.
    Fits already in ``ledger`` are reused, new ones stored there (floors are recomputed)."""
    check_config(config, qk)
    records: list[Record] = []
    for layer in qk.layers:
        for head in qk.heads:
            split = split_pairs(*qk.get(layer, head), config, qk.train_only)
            for p in config.ps:
                floors = floor_records(split, p, layer, head, config)
                records += floors
                if log:
                    log(f"[L{layer} h{head} p={p}] floor: rel. Frobenius "
                        f"{floors[0].rel_frobenius:.4f}, truncated-SVD RMAE {floors[0].rmae:.4f}"
                        f" ({split.q_train.shape[0]} train / {split.q_test.shape[0]} held-out "
                        f"tokens, q·k scale c={split.scale:.4g})")
                records += method_records(split, p, layer, head, config, log,
                                          floors[0].rel_frobenius, ledger)
    return records
