"""BASED's second-order Taylor features written straight into one buffer.

Reference: :func:`arbench.naive.naive_taylor_features` (the concatenation
``[1, a·x̃, b·vec(x̃ x̃ᵀ)]``), value and gradient.
"""

from __future__ import annotations

import torch

from arbench.precision import CPU_AUTOCAST_DTYPE


class TaylorFeatures(torch.autograd.Function):
    """``[1, a·x̃, b·vec(x̃ x̃ᵀ)]`` written into one ``(rows, 1 + r + r²)`` buffer (no
    concatenation, no full-width temporaries). ``x̃``: ``(rows, r)``. Under autocast it runs in
    bf16 (each feature is one product of two factors; the backward's sums run over r).

    Backward: ``∂x̃ = a·∂first + b·(∂S + ∂Sᵀ) x̃`` with ``∂S`` the ``(r, r)`` gradient of the
    outer product, read in place from the incoming gradient.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=CPU_AUTOCAST_DTYPE)
    def forward(ctx, xt: torch.Tensor, a: float, b: float) -> torch.Tensor:  # type: ignore[override]
        n, r = xt.shape
        out = xt.new_empty(n, 1 + r + r * r)
        out[:, 0].fill_(1.0)
        torch.mul(xt, a, out=out[:, 1:1 + r])
        torch.mul((xt * b).unsqueeze(-1), xt.unsqueeze(-2), out=out[:, 1 + r:].view(n, r, r))
        ctx.save_for_backward(xt)
        ctx.scales = (a, b)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (xt,) = ctx.saved_tensors
        grad = grad.to(xt.dtype)
        a, b = ctx.scales
        n, r = xt.shape
        outer = grad[:, 1 + r:].reshape(n, r, r)
        col = xt.unsqueeze(-1)
        grad_xt = (torch.bmm(outer, col) + torch.bmm(outer.transpose(1, 2), col)).squeeze(-1)
        return grad_xt.mul_(b).add_(grad[:, 1:1 + r], alpha=a), None, None


def taylor_features(xt: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """``(..., r)`` → ``(..., 1 + r + r²)`` through :class:`TaylorFeatures`."""
    r = xt.shape[-1]
    flat = TaylorFeatures.apply(xt.reshape(-1, r), a, b)
    return flat.view(*xt.shape[:-1], 1 + r + r * r)


__all__ = ["TaylorFeatures", "taylor_features"]
