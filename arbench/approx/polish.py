"""Full-batch L-BFGS on a feature-map pair until the training loss is stationary.

The loss is L = ‖φ_Q(Q) φ_K(K)ᵀ − A‖²_F / ‖A‖²_F over every pair of the training queries
``Q`` ``(nq, d)`` and keys ``K`` ``(nk, d)`` (A = target(Q, K), no batches, no noise), so the
gradient norm ‖∇L‖₂ over all the pair's parameters says how far the fit is from a stationary
point. Stopping rule, checked before every step: ‖∇L‖₂ ≤ ``gtol`` → ``"stationary"``; else
``patience`` steps in a row each lowering L by less than ``ftol``·L → ``"stalled"``; else after
``steps`` steps → ``"max steps"``. The gradient norm at the stop is recorded either way. It
runs in the dtype of ``q`` (float32 in the study, whose ALS starts run in float64), so ``gtol``
bounds the float32 gradient of the relative loss, and ``ftol`` (10⁻⁶) lies near float32's
rounding of a sum over millions of pairs.

Given held-back validation pairs (not fitted), the loss on them is measured before every step:
the parameters of its least value are the ones kept, and ``patience`` steps in a row without a
new least stop the polish (``"validation"``); the training loss and gradient norm recorded are
the kept parameters', and a stop for another reason that keeps an earlier step says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from arbench.approx.methods import KernelPair


@dataclass(frozen=True)
class PolishConfig:
    """The stopping rule of :func:`polish` (module docstring) and L-BFGS's history size."""

    steps: int = 200
    gtol: float = 1e-5
    ftol: float = 1e-6
    patience: int = 10
    history: int = 20


@dataclass
class PolishResult:
    """Loss before and after, steps taken, why it stopped, ‖∇L‖₂ at the stop, seconds."""

    first_loss: float = float("nan")
    last_loss: float = float("nan")
    steps: int = 0
    stopped: str = ""
    grad_norm: float = float("nan")
    seconds: float = 0.0
    val_loss: float = float("nan")  # on the validation pairs, at the kept parameters


Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Validation queries ``(nq, d)``, keys ``(nk, d)`` and their target ``(nq, nk)``."""


def relative_loss(pair: KernelPair, q: torch.Tensor, k: torch.Tensor,
                  a: torch.Tensor) -> torch.Tensor:
    """‖φ_Q(q) φ_K(k)ᵀ − a‖²_F / ‖a‖²_F (a 0-dim tensor, differentiable)."""
    return (pair(q, k) - a).pow(2).sum() / a.pow(2).sum().clamp_min(1e-30)


def loss_and_grad(pair: KernelPair, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor,
                  params: list[torch.nn.Parameter]) -> tuple[float, float]:
    """L at the current parameters (gradients left in ``.grad``) and ‖∇L‖₂."""
    for prm in params:
        prm.grad = None
    loss = relative_loss(pair, q, k, a)
    loss.backward()
    norm = torch.sqrt(sum((prm.grad.double() ** 2).sum() for prm in params
                          if prm.grad is not None))
    return loss.item(), float(norm)


def polish(pair: KernelPair, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor,
           config: PolishConfig, label: str = "", val: Pairs | None = None) -> PolishResult:
    """Minimise L (module docstring) over ``pair``'s trainable parameters in place.

    ``q`` ``(nq, d)``, ``k`` ``(nk, d)``, ``a`` ``(nq, nk)`` = target(q, k); ``val``: validation
    pairs whose least loss picks the parameters kept (module docstring). Raises
    ``FloatingPointError`` if the loss stops being finite.
    """
    params = [prm for prm in pair.parameters() if prm.requires_grad]
    result = PolishResult()
    if not pair.fitted or not params:
        return result
    start = time.perf_counter()
    a = a.to(q.dtype)
    # one iteration per call; max_eval must be set (its default, 5/4 of max_iter, is 1 here
    # and leaves the line search no evaluation after the first)
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=1, max_eval=25, history_size=config.history,
                            tolerance_grad=-1.0, tolerance_change=0.0,
                            line_search_fn="strong_wolfe")
    cached = {"fresh": False, "loss": 0.0}

    def closure() -> torch.Tensor:
        if cached["fresh"]:  # the gradient of this point is already in .grad
            cached["fresh"] = False
            return torch.tensor(cached["loss"])
        opt.zero_grad(set_to_none=True)
        loss = relative_loss(pair, q, k, a)
        loss.backward()
        return loss.detach()

    slow = since_best = 0
    previous = best_val = float("inf")
    best_state: dict[str, torch.Tensor] | None = None
    if val is not None:
        val = (val[0], val[1], val[2].to(val[0].dtype))
    while True:
        loss, grad_norm = loss_and_grad(pair, q, k, a, params)
        if not (torch.isfinite(torch.tensor(loss)) and torch.isfinite(torch.tensor(grad_norm))):
            raise FloatingPointError(f"{label or pair.name}: L-BFGS loss is {loss} at step "
                                     f"{result.steps}")
        if result.steps == 0:
            result.first_loss = loss
        slow = slow + 1 if previous - loss < config.ftol * previous else 0
        previous = loss
        result.last_loss, result.grad_norm = loss, grad_norm
        if val is not None:
            with torch.no_grad():
                val_loss = float(relative_loss(pair, *val))
            if val_loss < best_val:
                best_val, since_best = val_loss, 0
                best_state = {n: v.detach().clone() for n, v in pair.state_dict().items()}
            else:
                since_best += 1
        if grad_norm <= config.gtol:
            result.stopped = "stationary"
        elif val is not None and since_best >= config.patience:
            result.stopped = "validation"
        elif slow >= config.patience:
            result.stopped = "stalled"
        elif result.steps >= config.steps:
            result.stopped = "max steps"
        if result.stopped:
            break
        cached.update(fresh=True, loss=loss)
        opt.step(closure)
        result.steps += 1
    if best_state is not None:
        result.val_loss = best_val
        if since_best:  # an earlier step's parameters
            pair.load_state_dict(best_state)
            result.last_loss, result.grad_norm = loss_and_grad(pair, q, k, a, params)
            if result.stopped != "validation":  # the reason was the last step's
                result.stopped += ", step of least validation loss kept"
    for prm in params:
        prm.grad = None
    result.seconds = time.perf_counter() - start
    return result
