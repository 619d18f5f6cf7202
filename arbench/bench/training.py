"""Training throughput: tokens/s of one AdamW step of the RecallModel (2 layers: conv, linear).

Two heads: ``answer`` (``model.loss``: the LM head only at the scored positions, the training
path) and ``full`` (cross-entropy of ``model(x)`` at every position, ``ignore_index=-100``);
with ``compiled=True`` a third, ``answer_compiled``: the answer head with the model body run
through ``torch.compile`` (``RecallModel.compile_body``, as ``model.compile: true`` trains);
with ``bf16=True`` an ``answer_bf16`` head: the answer-head step under bf16 autocast (fp32
weights and AdamW state, as ``--trainer.precision bf16-mixed`` trains), its FLOP/s read against
the bf16 matmul reference, and ``answer_bf16_conv_fp32``: the same with the conv layer kept in
fp32 (``--model.fp32_mixers [conv]``, the parity study's third arm), read against the same.

FLOPs of a step = 3 × forward (see ``arbench.bench.flops``); the forward counts the linear
layers (``2·rows·in·out``), the depthwise convolution (``2·T·D·k``), the feature maps, the
chunked attention and the head with its log-softmax (``rows·(2·D·V + 3·V)``, rows = scored
positions or all T = batch·seq tokens). Norms, residual adds, gating and the optimizer update
are not counted (under 1% at these sizes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from arbench.bench.config import TrainSpec
from arbench.bench.flops import (
    FWD_BWD_FACTOR,
    linear_flops,
    linear_layer_flops,
)
from arbench.bench.timing import Case, round_robin, summary
from arbench.data.mqar import IGNORE_INDEX, generate_mqar
from arbench.featuremaps import LLoPS
from arbench.mixers import LinearAttention, ShortConv
from arbench.model import RecallModel
from arbench.optim import make_adamw

HEADS = ("answer", "full")
BF16_HEADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "answer_bf16": ("bf16", ()),
    "answer_bf16_conv_fp32": ("bf16 with the conv layer in fp32", ("conv",)),
}
"""The bf16 heads (``bf16=True``): what each is, in words, and the mixers it keeps in fp32."""


def build_model(spec: TrainSpec, device: str, seed: int = 0,
                fp32_mixers: tuple[str, ...] = ()) -> RecallModel:
    """The spec's RecallModel (LLoPS m, p, one head) on ``device``, seeded; ``fp32_mixers``
    run in fp32 under autocast."""
    torch.manual_seed(seed)
    fmap = partial(LLoPS, m=spec.m, p=spec.p)
    model = RecallModel(vocab_size=spec.vocab, d_model=spec.d_model, n_layers=2,
                        mixers=("conv", "linear"), feature_map=fmap, fp32_mixers=fp32_mixers)
    return model.to(device)


def mixer_flops(mixer: nn.Module, batch: int, seq: int) -> float:
    """Forward FLOPs of one mixer on ``batch × seq`` tokens (conv or linear attention)."""
    tokens = batch * seq
    if isinstance(mixer, ShortConv):
        d = mixer.d_model
        return 3 * linear_flops(tokens, d, d) + 2.0 * tokens * d * mixer.kernel_size
    if type(mixer) is LinearAttention:  # a gated or delta mixer has other formulas
        d = mixer.num_heads * mixer.head_dim
        per_head = linear_layer_flops(mixer.phi_q, mixer.phi_k, seq, mixer.head_dim,
                                      mixer.chunk_size, mixer.normalize != "none",
                                      batch * mixer.num_heads)
        return linear_flops(tokens, d, 3 * d) + linear_flops(tokens, d, d) + per_head
    raise TypeError(f"no FLOP formula for mixer {type(mixer).__name__}")


def step_flops(model: RecallModel, batch: int, seq: int, head_rows: int) -> float:
    """FLOPs of one training step (3 × forward) with the head applied to ``head_rows`` rows."""
    body = sum(mixer_flops(block.mixer, batch, seq) for block in model.blocks)
    head = head_rows * (2.0 * model.d_model * model.vocab_size + 3.0 * model.vocab_size)
    return FWD_BWD_FACTOR * (body + head)


def full_head_loss(model: RecallModel, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits at every position (unscored labels ignored)."""
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           ignore_index=IGNORE_INDEX)


def make_step(model: RecallModel, opt: torch.optim.Optimizer, x: torch.Tensor,
              labels: torch.Tensor, head: str) -> Callable[[], None]:
    """A closure running one AdamW step of ``model`` on ``(x, labels)`` with ``head``
    (the heads of :data:`BF16_HEADS`: the forward under bf16 autocast; the backward outside it,
    as Lightning does)."""
    bf16 = head in BF16_HEADS

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = full_head_loss(model, x, labels) if head == "full" else model.loss(x, labels)
        loss.backward()
        opt.step()
    return step


def training_cases(specs: Sequence[TrainSpec], device: str, seed: int, compiled: bool = False,
                   bf16: bool = False) -> tuple[list[Case], dict[tuple[str, str], dict]]:
    """One warmed-up case per (spec, head) and its static facts (tokens, FLOPs, rows)."""
    cases, facts = [], {}
    heads = (*HEADS, *(("answer_compiled",) if compiled else ()), *(BF16_HEADS if bf16 else ()))
    for spec in specs:
        x, labels = generate_mqar(spec.batch, spec.seq, spec.pairs, spec.vocab, seed=seed)
        x, labels = x.to(device), labels.to(device)
        scored = int((labels != IGNORE_INDEX).sum())
        for head in heads:
            model = build_model(spec, device, seed, BF16_HEADS.get(head, ("", ()))[1])
            if head == "answer_compiled":
                model.compile_body()
            opt = make_adamw(model.parameters(), lr=1e-3, weight_decay=0.1)
            step = make_step(model, opt, x, labels, head)
            step(), step()
            rows = spec.batch * spec.seq if head == "full" else scored
            facts[(spec.name, head)] = {"tokens": spec.batch * spec.seq, "head_rows": rows,
                                        "flops": step_flops(model, spec.batch, spec.seq, rows)}
            cases.append(Case((spec.name, head), step))
    return cases, facts


def measure_training(specs: Sequence[TrainSpec], device: str, samples: int,
                     peaks_gflops: dict[str, float], seed: int = 0, compiled: bool = False,
                     bf16: bool = False) -> list[dict]:
    """Rows ``{spec, head, tokens_per_s (median/min/max), step_ms, gflops, frac_peak, ...}``;
    ``frac_peak`` against ``peaks_gflops["bf16"]`` for the bf16 head, else ``["fp32"]``."""
    cases, facts = training_cases(specs, device, seed, compiled, bf16)
    round_robin([cases], samples, device)
    by_spec = {s.name: s for s in specs}
    rows = []
    for case in cases:
        name, head = case.key
        fact, stats = facts[case.key], summary(case.samples)
        gflops = fact["flops"] / stats["median"] / 1e9
        peak_gflops = peaks_gflops["bf16" if head in BF16_HEADS else "fp32"]
        rows.append({"spec": name, "head": head, **vars_of(by_spec[name]),
                     "step_ms": 1e3 * stats["median"], "step_ms_min": 1e3 * stats["min"],
                     "step_ms_max": 1e3 * stats["max"],
                     "tokens_per_s": fact["tokens"] / stats["median"],
                     "tokens_per_s_min": fact["tokens"] / stats["max"],
                     "tokens_per_s_max": fact["tokens"] / stats["min"],
                     "head_rows": fact["head_rows"], "gflop_per_step": fact["flops"] / 1e9,
                     "gflops": gflops, "frac_peak": gflops / peak_gflops,
                     "samples": len(case.samples)})
    return rows


def vars_of(spec: TrainSpec) -> dict:
    """The spec's sizes as a dict (without its name)."""
    return {k: getattr(spec, k) for k in ("vocab", "d_model", "m", "p", "batch", "seq", "pairs")}


__all__ = ["HEADS", "build_model", "measure_training", "step_flops"]
