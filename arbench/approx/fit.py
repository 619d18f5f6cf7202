"""Fitting a feature-map pair to a target kernel on (query, key) pairs of a training split."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from arbench.approx.methods import KernelPair

Target = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Log = Callable[[str], None]


@dataclass(frozen=True)
class FitConfig:
    """Adam with cosine decay to ``lr/100``; each step uses ``batch`` queries × ``batch`` keys.

    ``init_ratio``: before the first step the estimate is rescaled (through the parameters)
    so that its Frobenius norm on the first batch is ``init_ratio`` times the target's
    (0 disables it; maps without a rescaling rule are left as built).
    """

    steps: int = 1000
    lr: float = 1e-2
    batch: int = 512
    seed: int = 0
    init_ratio: float = 0.5
    restarts: int = 1  # fit_best: seeds seed, seed + 1, ... per learning rate
    log_every: int = 0  # 0: no per-step lines


@dataclass
class FitResult:
    """Loss (relative squared Frobenius error of the batch) at the first and last step."""

    first_loss: float = float("nan")
    last_loss: float = float("nan")
    seconds: float = 0.0
    lr: float = float("nan")
    losses: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 5% of the steps (the selection criterion across lrs)."""
        if not self.losses:
            return float("nan")
        tail = self.losses[-max(1, len(self.losses) // 20):]
        return sum(tail) / len(tail)


def fit_pair(pair: KernelPair, q: torch.Tensor, k: torch.Tensor, target: Target,
             config: FitConfig, log: Log | None = None, label: str = "") -> FitResult:
    """Minimise ‖φ_Q(q_B) φ_K(k_B)ᵀ − target(q_B, k_B)‖_F² / ‖target‖_F² over random batches.

    ``q`` ``(nq, d)`` and ``k`` ``(nk, d)`` are the training queries and keys; every step draws
    ``min(batch, n)`` of each (seeded), so all nq·nk pairs are in reach. Returns the losses.
    """
    result = FitResult(lr=config.lr)
    params = [prm for prm in pair.parameters() if prm.requires_grad]
    if not pair.fitted or not params or config.steps < 1:
        return result
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.Adam(params, lr=config.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps, eta_min=config.lr / 100)
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
        loss = (pair(qb, kb) - a).pow(2).sum() / a.pow(2).sum().clamp_min(1e-30)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{label or pair.name}: loss is {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        result.losses.append(loss.item())
        if log is not None and config.log_every and step % config.log_every == 0:
            log(f"  {label or pair.name}: step {step}/{config.steps} loss {loss.item():.4g}")
    result.first_loss, result.last_loss = result.losses[0], result.losses[-1]
    result.seconds = time.perf_counter() - start
    return result


def fit_best(build: Callable[[], KernelPair | None], q: torch.Tensor, k: torch.Tensor,
             target: Target, config: FitConfig, lrs: Sequence[float], log: Log | None = None,
             label: str = "") -> tuple[KernelPair, FitResult] | None:
    """Fit a fresh ``build()`` per learning rate in ``lrs`` and restart seed.

    Restart i builds and draws batches with seed ``config.seed + i``. Keeps the pair with the
    lowest final training loss; the total time of all the fits is in its result.
    ``None`` when ``build()`` gives ``None`` (the method does not fit this m).
    """
    best: tuple[KernelPair, FitResult] | None = None
    total = 0.0
    runs = [(lr, config.seed + i) for lr in lrs for i in range(max(1, config.restarts))]
    for lr, seed in runs:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            pair = build()
        if pair is None:
            return None
        result = fit_pair(pair, q, k, target, replace(config, lr=lr, seed=seed), log, label)
        total += result.seconds
        if not pair.fitted:
            return pair, result
        if best is None or result.final_loss < best[1].final_loss:
            best = (pair, result)
    assert best is not None, "fit_best needs at least one learning rate"
    best[1].seconds = total
    return best
