"""Fitting a feature-map pair to a target kernel on (query, key) pairs of a training split."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from arbench.approx.methods import KernelPair
from arbench.approx.polish import PolishConfig, polish, relative_loss
from arbench.approx.starts import StartConfig, data_start, start_name

Target = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Log = Callable[[str], None]


@dataclass(frozen=True)
class FitConfig:
    """Adam; each step uses ``batch`` queries × ``batch`` keys of the training pairs.

    ``until_plateau`` (default): an eighth of the training queries and keys is held back for
    validation, and every ``check_every`` steps the loss on all their pairs is measured. When
    it has not fallen by ``min_improvement`` (relative) for ``patience`` checks, the lr drops
    tenfold; after ``lr_drops`` drops the next such stall ends the fit (``stopped =
    "plateau"``), else ``steps`` does (``"max steps"``). The parameters of the best
    validation loss are kept. Otherwise: exactly ``steps`` steps, cosine decay to ``lr/100``.

    ``init_ratio``: before the first step the estimate is rescaled (through the parameters)
    so that its Frobenius norm on the first batch is ``init_ratio`` times the target's
    (0 disables it; maps without a rescaling rule are left as built).

    :func:`fit_best` only: with ``data_start``, maps that have one start from the training
    data (:mod:`arbench.approx.starts`, settings ``start``) instead of the Adam fit; then every
    fitted map is polished by full-batch L-BFGS to a stationary point (:mod:`arbench.approx.
    polish`, settings ``polish``; ``polish.steps = 0`` turns it off).

    Validation pairs given to :func:`fit_best` (whole sequences held back from training,
    :func:`arbench.approx.study.split_pairs`) replace Adam's held-back eighth, and the data
    starts and the polish keep their parameters of least loss on them too (ALS: stop after
    ``patience`` sweeps without a new least; L-BFGS: after ``polish.patience`` steps), so every
    fit of every map stops on the same pairs. Without them ALS and L-BFGS fit every training
    pair to their own stopping rules.
    """

    steps: int = 1000
    until_plateau: bool = True
    check_every: int = 100
    patience: int = 3
    min_improvement: float = 0.01
    lr_drops: int = 2
    lr: float = 1e-2
    batch: int = 512
    seed: int = 0
    init_ratio: float = 0.5
    restarts: int = 1  # fit_best: seeds seed, seed + 1, ... per learning rate
    log_every: int = 0  # 0: no per-step lines
    data_start: bool = True
    start: StartConfig = field(default_factory=StartConfig)
    polish: PolishConfig = field(default_factory=PolishConfig)


@dataclass
class FitResult:
    """Loss (relative squared Frobenius error of the batch) at the first and last step; with
    ``until_plateau`` the validation curve, the best validation loss, steps and why it ended."""

    first_loss: float = float("nan")
    last_loss: float = float("nan")
    seconds: float = 0.0
    lr: float = float("nan")
    losses: list[float] = field(default_factory=list)
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    best_val: float = float("nan")
    steps: int = 0
    stopped: str = ""
    start: str = ""  # fit_best: "adam", or the data start ("als", "svd") and how it ended
    polish_steps: int = 0
    grad_norm: float = float("nan")  # ‖∇L‖₂ of the full training loss at the stop

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 5% of the steps (the selection criterion across lrs)."""
        if not self.losses:
            return float("nan")
        tail = self.losses[-max(1, len(self.losses) // 20):]
        return sum(tail) / len(tail)

    @property
    def selection_loss(self) -> float:
        """What :func:`fit_best` compares: the best validation loss, else :attr:`final_loss`."""
        return self.best_val if self.val_curve else self.final_loss


def hold_back(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(q_fit, k_fit, q_val, k_val)``: the last eighth (at least one) of the training queries
    ``(nq, d)`` and keys ``(nk, d)`` held back for validation, the rest to fit."""
    hold_q, hold_k = max(1, q.shape[0] // 8), max(1, k.shape[0] // 8)
    return q[:-hold_q], k[:-hold_k], q[-hold_q:], k[-hold_k:]


class Plateau:
    """The ``until_plateau`` rule of :class:`FitConfig` over validation losses."""

    def __init__(self, config: FitConfig):
        self.config = config
        self.best = self.reference = float("inf")
        self.best_state: dict | None = None
        self.stalls = self.drops = 0

    def update(self, loss: float, module: torch.nn.Module,
               opt: torch.optim.Optimizer) -> bool:
        """Record ``loss``; keep ``module``'s state if best; drop the lr on a stall. True: stop."""
        if loss < self.best:
            self.best = loss
            self.best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        if loss < self.reference * (1 - self.config.min_improvement):
            self.reference, self.stalls = loss, 0
            return False
        self.stalls += 1
        if self.stalls < self.config.patience:
            return False
        if self.drops >= self.config.lr_drops:
            return True
        self.drops, self.stalls = self.drops + 1, 0
        for group in opt.param_groups:
            group["lr"] *= 0.1
        return False


def fit_pair(pair: KernelPair, q: torch.Tensor, k: torch.Tensor, target: Target,
             config: FitConfig, log: Log | None = None, label: str = "",
             val: tuple[torch.Tensor, torch.Tensor] | None = None) -> FitResult:
    """Minimise ‖φ_Q(q_B) φ_K(k_B)ᵀ − target(q_B, k_B)‖_F² / ‖target‖_F² over random batches.

    ``q`` ``(nq, d)`` and ``k`` ``(nk, d)`` are the training queries and keys; every step draws
    ``min(batch, n)`` of each (seeded), so all their pairs are in reach (less the validation
    eighth with ``until_plateau``, unless validation queries and keys ``val`` are given). Returns
    the :class:`FitResult` (losses, validation curve, best validation loss, steps run and why
    the fit stopped).
    """
    result = FitResult(lr=config.lr)
    params = [prm for prm in pair.parameters() if prm.requires_grad]
    if not pair.fitted or not params or config.steps < 1:
        return result
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.Adam(params, lr=config.lr)
    plateau = Plateau(config) if config.until_plateau else None
    if plateau is not None:
        q, k, q_val, k_val = hold_back(q, k) if val is None else (q, k, *val)
        with torch.no_grad():
            a_val = target(q_val, k_val)
        sched = None
    else:
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps,
                                                           eta_min=config.lr / 100)
    bq, bk = min(config.batch, q.shape[0]), min(config.batch, k.shape[0])
    start = time.perf_counter()
    for step in range(1, config.steps + 1):
        qb = q[torch.randperm(q.shape[0], generator=gen)[:bq]]
        kb = k[torch.randperm(k.shape[0], generator=gen)[:bk]]
        with torch.no_grad():
            a = target(qb, kb)
            if step == 1 and config.init_ratio > 0:
                norm = torch.linalg.norm(pair(qb, kb))
                if norm > 0:
                    pair.rescale_(float(config.init_ratio * torch.linalg.norm(a) / norm))
        loss = relative_loss(pair, qb, kb, a)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{label or pair.name}: loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        result.losses.append(loss.item())
        result.steps = step
        if log is not None and config.log_every and step % config.log_every == 0:
            log(f"  {label or pair.name}: step {step}/{config.steps} loss {loss.item():.4g}")
        if plateau is not None and step % config.check_every == 0:
            with torch.no_grad():
                val_loss = float(relative_loss(pair, q_val, k_val, a_val))
            result.val_curve.append((step, val_loss))
            if plateau.update(val_loss, pair, opt):
                result.stopped = "plateau"
                break
    if plateau is not None:
        result.stopped = result.stopped or "max steps"
        if plateau.best_state is not None:
            pair.load_state_dict(plateau.best_state)
            result.best_val = plateau.best
    result.first_loss, result.last_loss = result.losses[0], result.losses[-1]
    result.seconds = time.perf_counter() - start
    return result


def adam_best(build: Callable[[], KernelPair | None], q: torch.Tensor, k: torch.Tensor,
              target: Target, config: FitConfig, lrs: Sequence[float], log: Log | None = None,
              label: str = "", val: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[KernelPair, FitResult] | None:
    """Fit a fresh ``build()`` with Adam (:func:`fit_pair`) per learning rate in ``lrs`` and
    restart seed.

    Restart i builds and draws batches with seed ``config.seed + i``. Keeps the pair with the
    lowest :attr:`FitResult.selection_loss`; the total time of all the fits is in its result.
    ``None`` when ``build()`` gives ``None`` (the method does not fit this m).
    """
    best: tuple[KernelPair, FitResult] | None = None
    total = 0.0
    runs = [(lr, config.seed + i) for lr in lrs for i in range(max(1, config.restarts))]
    for lr, seed in runs:
        pair = seeded_build(build, seed)
        if pair is None:
            return None
        result = fit_pair(pair, q, k, target, replace(config, lr=lr, seed=seed), log, label,
                          val)
        total += result.seconds
        if not pair.fitted:
            return pair, result
        if best is None or result.selection_loss < best[1].selection_loss:
            best = (pair, result)
    assert best is not None, "fit_best needs at least one learning rate"
    best[1].seconds = total
    return best


def seeded_build(build: Callable[[], KernelPair | None], seed: int) -> KernelPair | None:
    """``build()`` under ``torch.manual_seed(seed)``, the global RNG restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def fit_best(build: Callable[[], KernelPair | None], q: torch.Tensor, k: torch.Tensor,
             target: Target, config: FitConfig, lrs: Sequence[float], log: Log | None = None,
             label: str = "", val: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[KernelPair, FitResult] | None:
    """Start, then polish: the study's fit of one method on training ``q`` ``(nq, d)``, ``k``
    ``(nk, d)``.

    Start: with ``config.data_start``, a map that has a data-driven start gets it
    (:func:`arbench.approx.starts.data_start`, built with seed ``config.seed``); any other
    map the best Adam fit of :func:`adam_best`. Polish: full-batch L-BFGS on all the training
    pairs until stationary (:func:`arbench.approx.polish.polish`), unless
    ``config.polish.steps`` is 0. With validation queries and keys ``val`` ``((nv, d), (nv, d))``
    every stage keeps its parameters of least loss on their pairs (:class:`FitConfig`). ``None``
    when ``build()`` gives ``None``.
    """
    started = None
    a: torch.Tensor | None = None
    pairs = None
    if val is not None:
        with torch.no_grad():
            pairs = (val[0], val[1], target(val[0], val[1]))
    if config.data_start:
        pair = seeded_build(build, config.seed)
        if pair is None:
            return None
        if pair.fitted and start_name(pair) is not None:
            start = time.perf_counter()
            with torch.no_grad():
                a = target(q.double(), k.double())
            started = data_start(pair, q, k, a, config.start,
                                 log if config.log_every else None, label, pairs,
                                 config.patience)
            seconds = time.perf_counter() - start
    if started is not None:
        result = FitResult(steps=started.steps, stopped=started.stopped, seconds=seconds,
                           first_loss=started.first_loss, last_loss=started.last_loss,
                           start=started.name + (f" ({started.stopped})" if started.stopped
                                                 else ""))
    else:
        fitted = adam_best(build, q, k, target, config, lrs, log, label, val)
        if fitted is None:
            return None
        pair, result = fitted
        if not pair.fitted:
            return pair, result
        result.start = f"adam ({result.stopped})" if result.stopped else "adam"
    if config.polish.steps > 0:
        with torch.no_grad():
            a = target(q, k) if a is None else a.to(q.dtype)
        polished = polish(pair, q, k, a, config.polish, label, pairs)
        result.polish_steps, result.grad_norm = polished.steps, polished.grad_norm
        result.stopped = polished.stopped
        if math.isnan(result.first_loss):  # no Adam steps or ALS sweeps before
            result.first_loss = polished.first_loss
        result.last_loss = polished.last_loss
        result.seconds += polished.seconds
    return pair, result
