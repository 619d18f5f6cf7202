"""Queries and keys of a softmax teacher's attention layers on held-out MQAR sequences."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from arbench.approx.qkset import QKSet
from arbench.data.mqar import generate_mqar
from arbench.mixers import SoftmaxAttention
from arbench.model import RecallModel


def softmax_layers(model: RecallModel) -> list[int]:
    """Indices into ``model.blocks`` whose mixer is softmax attention."""
    return [i for i, block in enumerate(model.blocks) if isinstance(block.mixer, SoftmaxAttention)]


def check_softmax_teacher(model: object, source: str = "model") -> RecallModel:
    """Return ``model`` if it is a RecallModel with a softmax layer, else raise ``ValueError``."""
    if not isinstance(model, RecallModel):
        raise ValueError(f"{source} is not a softmax teacher: expected a RecallModel, got "
                         f"{type(model).__name__}")
    if not softmax_layers(model):
        raise ValueError(f"{source} is not a softmax teacher: its mixers are "
                         f"{model.mixer_names}, none is 'softmax'")
    return model


def check_layers_heads(model: RecallModel, layers: list[int], heads: list[int]) -> None:
    """Raise ``ValueError`` for a layer out of range or not softmax, or a head out of range."""
    n_layers = len(model.blocks)
    soft = softmax_layers(model)
    if not layers:
        raise ValueError("no layers selected")
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer index {layer} is out of range: the model has {n_layers} "
                             f"layers (0..{n_layers - 1}); softmax layers are {soft}")
        if layer not in soft:
            raise ValueError(f"layer {layer} is a {model.mixer_names[layer]!r} layer, not "
                             f"softmax attention; softmax layers are {soft}")
    num_heads = model.blocks[soft[0]].mixer.num_heads
    if not heads:
        raise ValueError("no heads selected")
    for head in heads:
        if not 0 <= head < num_heads:
            raise ValueError(f"head index {head} is out of range: the attention layers have "
                             f"{num_heads} heads (0..{num_heads - 1})")


@torch.no_grad()
def extract_qk(model: RecallModel, inputs: torch.Tensor, layers: list[int], heads: list[int],
               batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys ``(L, H, S, n, head_dim)`` of ``inputs`` ``(S, n)`` token ids.

    A forward pre-hook on each chosen block's mixer takes its input (the block's normalised
    residual stream) and applies ``mixer.qkv_heads``; the model runs in eval mode.
    """
    check_layers_heads(model, layers, heads)
    captured: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in layers}

    def hook(layer: int):
        def capture(mixer: SoftmaxAttention, args: tuple[Any, ...]) -> None:
            q, k, _ = mixer.qkv_heads(args[0])
            captured[layer].append((q[:, heads].float(), k[:, heads].float()))
        return capture

    handles = [model.blocks[i].mixer.register_forward_pre_hook(hook(i)) for i in layers]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, inputs.shape[0], batch_size):
            model.hidden(inputs[start:start + batch_size])
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    # per layer: (S, H, n, d) -> (H, S, n, d)
    q = torch.stack([torch.cat([c[0] for c in captured[i]]).transpose(0, 1) for i in layers])
    k = torch.stack([torch.cat([c[1] for c in captured[i]]).transpose(0, 1) for i in layers])
    return q, k


def model_config(model: RecallModel) -> dict[str, Any]:
    """The structural settings of ``model`` as plain values (for the extraction's metadata)."""
    soft = softmax_layers(model)
    return {"vocab_size": model.vocab_size, "d_model": model.d_model,
            "n_layers": len(model.blocks), "mixers": list(model.mixer_names),
            "num_heads": model.blocks[soft[0]].mixer.num_heads if soft else None}


def extract_from_teacher(model: RecallModel, layers: list[int], heads: list[int],
                         num_seqs: int = 32, seq_len: int = 128, num_kv_pairs: int = 16,
                         seed: int = 10_000, checkpoint: str | None = None,
                         train_seqs: int = 0, train_seed: int = 10_001) -> QKSet:
    """Generate held-out MQAR sequences (own ``seed``) and capture q, k of ``layers``/``heads``.

    ``train_seqs`` more sequences (seed ``train_seed``) follow them as training-only data
    (:attr:`QKSet.train_only`); the first ``num_seqs`` do not depend on them.
    """
    model = check_softmax_teacher(model, checkpoint or "model")
    check_layers_heads(model, layers, heads)
    inputs, _ = generate_mqar(num_seqs, seq_len, num_kv_pairs, vocab_size=model.vocab_size,
                              seed=seed)
    if train_seqs > 0:
        extra, _ = generate_mqar(train_seqs, seq_len, num_kv_pairs,
                                 vocab_size=model.vocab_size, seed=train_seed)
        inputs = torch.cat([inputs, extra])
    q, k = extract_qk(model, inputs, layers, heads)
    data = {"num_seqs": num_seqs, "seq_len": seq_len, "num_kv_pairs": num_kv_pairs, "seed": seed}
    if train_seqs > 0:
        data |= {"train_seqs": train_seqs, "train_seed": train_seed}
    meta = {"source": "teacher", "layers": list(layers), "heads": list(heads),
            "config": model_config(model), "data": data, "checkpoint": checkpoint}
    return QKSet(q, k, list(layers), list(heads), meta, train_only=max(0, train_seqs))


def load_teacher(path: str | Path) -> RecallModel:
    """Load a Lightning checkpoint of ``arbench.lit.LitRecall`` and return its softmax model.

    Raises ``ValueError`` (one line) for a missing or unreadable file, one whose unpickling
    would build objects other than tensors and plain values (it could run code: loaded with
    ``weights_only=True`` only), or a model without softmax attention.
    """
    from arbench.ckpt_check import read_checkpoint

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"teacher checkpoint {path} does not exist")
    read_checkpoint(str(path), "--teacher", ValueError)  # refuses a file that would run code
    try:
        lit = importlib.import_module("arbench.lit")
    except ImportError as exc:
        raise ValueError(f"loading a teacher checkpoint needs arbench.lit: {exc}") from exc
    try:
        module = lit.LitRecall.load_from_checkpoint(str(path), map_location="cpu",
                                                    weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot load {path} as a LitRecall checkpoint: {first}") from exc
    model = check_softmax_teacher(getattr(module, "model", None), f"checkpoint {path}")
    model.eval()
    return model
