"""The benchmarked methods: one attention layer each, ``(q, k, v) -> y``, all ``(b, h, n, d)``.

A linear method is φ_Q(q), φ_K(k) and causal linear attention (chunked by default);
softmax is ``scaled_dot_product_attention``. The projections producing q, k, v are not part of
the layer (they are the same for every method).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from arbench.attention import delta_attention, linear_attention, softmax_attention
from arbench.bench.config import BenchConfig
from arbench.bench.flops import (
    FWD_BWD_FACTOR,
    linear_layer_flops,
    linear_layer_fwd_bwd_flops,
    softmax_attention_flops,
)
from arbench.delta import l2_normalize
from arbench.featuremaps import FeatureMap
from arbench.kernels import fla_backend
from arbench.registry import FEATURE_MAPS, FEATURE_MIXERS, MethodConfig, load_method_config

PASSES = ("fwd", "fwd_bwd")


@dataclass(frozen=True)
class Method:
    """A method of the grid: ``name`` (e.g. ``llops_p4_t1``), ``family`` (a registry name,
    or ``softmax``), its hyperparameters for the tables and, for a linear method, ``fmap``:
    the feature map's class and arguments."""

    name: str
    family: str
    p: int = 0
    rank: int = 1
    m: int = 0
    compiled: bool = False
    bf16: bool = False
    rule: str = "linear"
    fmap: MethodConfig | None = None

    @property
    def derived(self) -> bool:
        """True for a method derived from a plain one: a ``_compiled`` or ``_bf16`` twin, or
        another state update."""
        return self.compiled or self.bf16 or self.rule != "linear"

    @property
    def linear(self) -> bool:
        return self.family != "softmax"


def _grid_method(name: str, family: str, table: tuple[int, int, int], **kwargs: int) -> Method:
    """A shipped map of the grid: the registry's ``family`` built with ``kwargs``; ``table``:
    its (p, rank, features) for the tables."""
    return Method(name, family, *table, fmap=MethodConfig(name, family, tuple(kwargs.items())))


def config_method(method: MethodConfig, cfg: BenchConfig) -> Method:
    """The feature map of a method config as a method of the grid (family: its registry name,
    else ``custom``; p, rank and features from its ``hparams()``)."""
    fmap = method.build(cfg.head_dim)
    hp = fmap.hparams()
    family = next((k for k, c in FEATURE_MAPS.items() if type(fmap) is c), "custom")
    return Method(method.name, family, int(hp.get("p", 0)), int(hp.get("rank", 1)),
                  fmap.feature_dim, fmap=method)


def method_list(cfg: BenchConfig) -> list[Method]:
    """LLoPS for every (p, rank), BASED, Flatten, PolySketch, softmax and the maps of
    ``cfg.method_configs``; filtered by ``cfg.methods`` (with method configs: those and the
    configs' maps)."""
    b, bp = cfg.based_r, cfg.baseline_p
    out = [_grid_method(f"llops_p{p}_t{t}", "llops", (p, t, cfg.m), m=cfg.m, p=p, rank=t)
           for t in cfg.ranks for p in cfg.ps]
    out += [_grid_method(f"based_r{b}", "based", (2, 1, 1 + b + b ** 2), r=b),
            _grid_method(f"flatten_p{bp}", "flatten", (bp, 1, cfg.m), m=cfg.m, p=bp),
            _grid_method(f"polysketch_p{bp}", "polysketch", (bp, 1, cfg.m), m=cfg.m, p=bp),
            Method("softmax", "softmax")]
    configs = [config_method(load_method_config(path), cfg) for path in cfg.method_configs]
    clash = [m.name for m in configs if [c.name for c in out + configs].count(m.name) > 1]
    if clash:
        raise ValueError(f"method name {clash[0]!r} is taken: give the method config another "
                         "trainer.logger.init_args.name")
    out += configs
    if cfg.rules:
        base = {m.name: m for m in out}.get(cfg.rule_base)
        if base is None or not base.linear:
            raise ValueError(f"rule_base {cfg.rule_base!r} is not a linear method here; choose "
                             f"from {[m.name for m in out if m.linear]}")
        unknown = set(cfg.rules) - set(RULES)
        if unknown:
            raise ValueError(f"unknown state updates {sorted(unknown)}; choose from {RULES}")
        out += [replace(base, name=f"{rule}_{base.name}", rule=rule) for rule in cfg.rules]
    if cfg.methods or configs:
        unknown = set(cfg.methods) - {m.name for m in out}
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; choose from {[m.name for m in out]}")
        keep = set(cfg.methods) | {m.name for m in configs}
        out = [m for m in out if m.name in keep]
    if cfg.compile:
        linear = {m.name: m for m in out if m.linear}
        names = list(linear) if cfg.compile == ("all",) else list(cfg.compile)
        unknown = set(names) - set(linear)
        if unknown:
            raise ValueError(f"cannot compile {sorted(unknown)}; linear methods here: {list(linear)}")
        out += [replace(linear[n], name=f"{n}_compiled", compiled=True) for n in names]
    if cfg.bf16:
        plain = {m.name: m for m in out if not m.compiled}
        names = list(plain) if cfg.bf16 == ("all",) else list(cfg.bf16)
        unknown = set(names) - set(plain)
        if unknown:
            raise ValueError(f"no method {sorted(unknown)} to run in bf16; methods here: "
                             f"{list(plain)}")
        out += [replace(plain[n], name=f"{n}_bf16", bf16=True) for n in names]
    return out


def build_feature_map(method: Method, cfg: BenchConfig) -> FeatureMap:
    """A fresh feature map of ``method`` for head dim ``cfg.head_dim``."""
    if method.fmap is None:
        raise ValueError(f"{method.name} has no feature map")
    return method.fmap.build(cfg.head_dim)


RULES = FEATURE_MIXERS  # the state updates a feature map is timed under
DECAY, BETA = -0.01, 0.5  # the fixed per-token log-decay and β of the timed gated/delta forms


class LinearLayer(nn.Module):
    """φ_Q, φ_K and a causal state update; ``mode`` and ``chunk_size`` may be changed.
    ``rule``: ``linear`` (additive), ``gated`` (log-decay ``DECAY`` per token), ``delta`` /
    ``gated_delta`` (β = ``BETA``; f and g L2-normalised as the mixers do). ``bf16``: the call
    runs under bf16 autocast (fp32 inputs and weights, as in mixed-precision training)."""

    def __init__(self, phi_q: nn.Module, phi_k: nn.Module, normalize: str, chunk_size: int,
                 mode: str = "chunked", bf16: bool = False, rule: str = "linear"):
        super().__init__()
        self.phi_q, self.phi_k = phi_q, phi_k
        self.normalize, self.chunk_size, self.mode, self.bf16 = normalize, chunk_size, mode, bf16
        self.rule = rule

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.autocast(q.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            f, g = self.phi_q(q), self.phi_k(k)
            gated = self.rule in ("gated", "gated_delta")
            log_decay = torch.full(q.shape[:-1], DECAY, device=q.device) if gated else None
            if self.rule in ("linear", "gated"):
                return linear_attention(f, g, v, mode=self.mode, chunk_size=self.chunk_size,
                                        normalize=self.normalize, log_decay=log_decay)
            beta = torch.full(q.shape[:-1], BETA, device=q.device)
            return delta_attention(l2_normalize(f), l2_normalize(g), v, beta,
                                   log_decay=log_decay, mode=self.mode,
                                   chunk_size=self.chunk_size)


class SoftmaxLayer(nn.Module):
    """Causal softmax attention (``scaled_dot_product_attention``), under bf16 autocast when
    ``bf16``."""

    def __init__(self, bf16: bool = False):
        super().__init__()
        self.bf16 = bf16

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with torch.autocast(q.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return softmax_attention(q, k, v)


def build_layer(method: Method, cfg: BenchConfig, chunk_size: int) -> nn.Module:
    """The layer of ``method`` on ``cfg.device``, seeded by ``cfg.seed`` (same weights every build)."""
    torch.manual_seed(cfg.seed)
    if not method.linear:
        return SoftmaxLayer(bf16=method.bf16).to(cfg.device)
    normalize = cfg.normalize if method.rule in ("linear", "gated") else "none"
    layer = LinearLayer(build_feature_map(method, cfg), build_feature_map(method, cfg),
                        normalize, chunk_size, bf16=method.bf16, rule=method.rule).to(cfg.device)
    if method.compiled:  # one graph per shape; the module's attributes stay readable
        # every compiled layer shares LinearLayer.forward's code object: one graph per
        # (layer, n, grad mode) must fit under dynamo's per-code-object limit (default 8)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4096)
        layer.forward = torch.compile(layer.forward, dynamic=False)
    return layer


def attention_backend(method: Method, cfg: BenchConfig) -> str:
    """Who computes the method's attention on ``cfg.device``: ``"sdpa"`` (softmax),
    ``"fla <version>"`` (a chunked form sent to fla: CUDA, bf16 twin, fla installed) or
    ``"arbench"`` (its own forms and CPU kernels; also every ``_compiled`` twin)."""
    if not method.linear:
        return "sdpa"
    if method.compiled:
        return "arbench"
    dtype = torch.bfloat16 if method.bf16 else torch.float32
    return fla_backend.backend_name(method.rule, cfg.device, dtype, method.m)


def skip_reason(method: Method, cfg: BenchConfig, n: int, pass_: str) -> str:
    """Why (method, n, pass) is not run, or ``""`` when it is."""
    cap = cfg.softmax_bwd_max_n
    if not method.linear and pass_ == "fwd_bwd" and 0 < cap < n:
        return f"skipped: softmax backward capped at n <= {cap}"
    return ""


def layer_flops(method: Method, layer: nn.Module, cfg: BenchConfig, n: int, pass_: str) -> float:
    """FLOPs of one call of ``layer`` on n tokens for ``pass_`` in ``PASSES``: at the chunk
    that computes it (fla's own, :data:`~arbench.kernels.fla_backend.FLA_CHUNK`, where fla
    does), the backward of a map without trainable weights as its input's gradient only."""
    bh = cfg.batch * cfg.heads
    if not method.linear:
        fwd = bh * softmax_attention_flops(n, cfg.head_dim)
        return fwd * (FWD_BWD_FACTOR if pass_ == "fwd_bwd" else 1.0)
    by_fla = attention_backend(method, cfg).startswith("fla")
    chunk = fla_backend.FLA_CHUNK if by_fla else layer.chunk_size
    count = linear_layer_fwd_bwd_flops if pass_ == "fwd_bwd" else linear_layer_flops
    return count(layer.phi_q, layer.phi_k, n, cfg.head_dim, chunk, layer.normalize != "none",
                 bh, layer.rule)


@dataclass
class Inputs:
    """q, k, v ``(b, h, n, d)`` and their requires-grad copies, plus the output gradient ``dy``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qg: torch.Tensor
    kg: torch.Tensor
    vg: torch.Tensor
    dy: torch.Tensor


def make_inputs(cfg: BenchConfig, n: int) -> Inputs:
    """Unit-variance random inputs for n tokens on ``cfg.device`` (seeded)."""
    gen = torch.Generator().manual_seed(cfg.seed + n)
    shape = (cfg.batch, cfg.heads, n, cfg.head_dim)
    q, k, v, dy = (torch.randn(shape, generator=gen).to(cfg.device) for _ in range(4))
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    return Inputs(q, k, v, *grads, dy)


def make_call(layer: nn.Module, inputs: Inputs, pass_: str) -> Callable[[], None]:
    """A no-argument closure running one ``pass_`` of ``layer``; it keeps no result or gradient.

    ``fwd`` runs under ``torch.no_grad`` (inference); ``fwd_bwd`` runs forward with gradients
    for q, k, v and the parameters, then ``backward(dy)``, then drops the gradients.
    """
    if pass_ == "fwd":
        def call() -> None:
            with torch.no_grad():
                layer(inputs.q, inputs.k, inputs.v)
        return call

    params = [inputs.qg, inputs.kg, inputs.vg, *layer.parameters()]

    def call_bwd() -> None:
        layer(inputs.qg, inputs.kg, inputs.vg).backward(inputs.dy)
        for t in params:
            t.grad = None
    return call_bwd


def forms_disagreement(layer: LinearLayer, inputs: Inputs) -> float:
    """Max |chunked − quadratic| / max |quadratic| over what the layer's attention computes.

    Both forms run on the layer's features and on ``[v, 1]`` (the denominator column) when the
    layer normalises, without the final division: the forms must agree on numerator and
    denominator; dividing by a denominator near zero would only magnify rounding. No gradient.
    """
    with torch.no_grad():
        f, g, v = layer.phi_q(inputs.q), layer.phi_k(inputs.k), inputs.v
        if layer.normalize != "none":
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        outs = [linear_attention(f, g, v, mode=mode, chunk_size=layer.chunk_size, normalize=False)
                for mode in ("chunked", "quadratic")]
    scale = outs[1].abs().max().clamp_min(1e-30)
    return float((outs[0] - outs[1]).abs().max() / scale)


def compiled_disagreement(compiled: LinearLayer, eager: LinearLayer, inputs: Inputs) -> float:
    """Max |compiled − eager| / max |eager| of two layers built with the same weights, forward."""
    with torch.no_grad():
        want = eager(inputs.q, inputs.k, inputs.v)
        got = compiled(inputs.q, inputs.k, inputs.v)
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
