"""Start a recall model from another run's checkpoint, converting its feature maps.

The paper's weight-inheritance protocol: every weight the two models share (embedding, short
convolution, q/k/v and output projections, norms, head) is copied; a BASED feature map becomes
the affine LLoPS map with exactly its kernel (:meth:`arbench.featuremaps.LLoPS.from_based`). The
optimiser is not copied: training continues with a fresh one.
"""

from __future__ import annotations

import torch
from torch import nn

from arbench.ckpt_check import read_checkpoint
from arbench.featuremaps import Based, LLoPS

BASED_WEIGHT = "proj.weight"


class WarmStartError(ValueError):
    """A checkpoint that cannot initialise this model; the message names the key."""


def checkpoint_weights(path: str) -> dict[str, torch.Tensor]:
    """The recall model's weights in a LitRecall checkpoint (keys without the ``model.``
    prefix)."""
    state = read_checkpoint(path, "init_from:", WarmStartError,
                            missing="{option} no checkpoint at {path}")["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def _convert_based(target: LLoPS, name: str, source: dict[str, torch.Tensor],
                   spare_std: float) -> dict[str, torch.Tensor]:
    """The ``theta``/``bias`` of ``target`` embedding the BASED map stored at ``name``."""
    weight = source[f"{name}.{BASED_WEIGHT}"]
    if not target.affine or target.rank != 1:
        raise WarmStartError(f"init_from: {name} is BASED in the checkpoint; embedding it needs "
                             "an affine rank-1 LLoPS map (--model.feature_map.init_args.affine "
                             "true, rank 1)")
    r, head_dim = weight.shape
    if head_dim != target.head_dim:
        raise WarmStartError(f"init_from: {name} has head_dim {head_dim} in the checkpoint and "
                             f"{target.head_dim} here (another d_model or num_heads?)")
    based = Based(head_dim, r=r).to(weight.dtype)
    with torch.no_grad():
        based.proj.weight.copy_(weight)
    try:
        embedded = LLoPS.from_based(based, p=target.p, m=target.m, spare_std=spare_std)
    except ValueError as err:
        raise WarmStartError(f"init_from: {name}: {err}") from None
    return {f"{name}.theta": embedded.theta.detach(), f"{name}.bias": embedded.bias.detach()}


def warm_start(model: nn.Module, path: str, spare_std: float = 0.0) -> list[str]:
    """Load ``path``'s weights into ``model`` (a :class:`~arbench.model.RecallModel`),
    converting BASED maps into the model's LLoPS maps. Returns the converted map names.

    Raises :class:`WarmStartError` (one line) for a shape mismatch (another d_model or vocab),
    a model weight the checkpoint has no source for, or a checkpoint weight left unused (a
    feature map with no known conversion).
    """
    source = checkpoint_weights(path)
    target = model.state_dict()
    for key, value in target.items():  # shared weights first: the likeliest mismatch
        if key in source and source[key].shape != value.shape:
            raise WarmStartError(f"init_from: {key} is {tuple(source[key].shape)} in the "
                                 f"checkpoint and {tuple(value.shape)} here (another d_model, "
                                 "vocab_size or feature map size?)")
    new: dict[str, torch.Tensor] = {}
    converted = []
    for name, module in model.named_modules():
        if isinstance(module, LLoPS) and f"{name}.{BASED_WEIGHT}" in source:
            new.update(_convert_based(module, name, source, spare_std))
            converted.append(name)
    used = {f"{name}.{BASED_WEIGHT}" for name in converted}
    for key in target:
        if key in new:
            continue
        if key not in source:
            raise WarmStartError(f"init_from: the checkpoint has no {key} and no known "
                                 "conversion for it (another feature map or architecture?)")
        new[key] = source[key]
        used.add(key)
    unused = sorted(set(source) - used)
    if unused:
        raise WarmStartError(f"init_from: checkpoint weight {unused[0]} has no place in this "
                             "model (a feature map with no known conversion?)")
    model.load_state_dict(new)
    return converted


__all__ = ["WarmStartError", "checkpoint_weights", "warm_start"]
