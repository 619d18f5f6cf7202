"""The recall model: embedding, pre-norm residual mixer blocks, final norm, tied LM head.

The default is the BASED recipe of the MQAR literature: 2 layers, no MLP, no positional
embedding; layer 0 a gated short convolution, layer 1 the attention mixer. Layer i takes entry
``i mod len(mixers)`` of the ``mixers`` list, whose names are:

- ``"conv"``: gated causal depthwise convolution (kernel ``conv_kernel``);
- ``"base_conv"``: zoology's BaseConv, ``conv(u) ⊙ (u W + b) + u``;
- ``"linear"``: linear attention with ``feature_map`` (required then, as for the next three);
- ``"gated"``: gated linear attention (a learned per-token decay of the state);
- ``"delta"``: the delta rule (DeltaNet) over L2-normalised features;
- ``"gated_delta"``: the delta rule with the decay (Gated DeltaNet);
- ``"softmax"``: softmax attention.

``block="zoology"`` and ``init_std=0.02`` build the backbone as zoology does for its MQAR rows
(the paper's BASED numbers come from there): see :class:`ZoologyBlock` and :func:`normal_init`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arbench.checks import check_int
from arbench.data.mqar import IGNORE_INDEX
from arbench.defaults import DEFAULT_N_LAYERS
from arbench.mixers import DecayGate, FeatureMapFactory, LinearAttention, mlp
from arbench.registry import FEATURE_MIXERS, MIXERS

MIXER_NAMES = tuple(MIXERS)
BLOCKS = ("prenorm", "zoology")
"""``block`` choices: :class:`Block` and :class:`ZoologyBlock`."""


def run_mixer(mixer: nn.Module, x: torch.Tensor, fp32: bool) -> torch.Tensor:
    """``mixer(x)``; when ``fp32`` and autocast is on for ``x``'s device, with autocast off and
    ``x`` in fp32, so every op of the mixer (its matmuls and kernels) computes in fp32 while the
    rest of the model runs in autocast's dtype. ``x``: ``(b, n, d_model)``."""
    if fp32 and torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return mixer(x.float())
    return mixer(x)


class Block(nn.Module):
    """``x + mixer(norm(x))``, then optionally ``x + mlp(norm(x))``; ``(b, n, d_model)``.
    ``fp32_mixer``: the mixer runs in fp32 under autocast (:func:`run_mixer`)."""

    def __init__(self, mixer: nn.Module, d_model: int, use_mlp: bool, fp32_mixer: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.mixer = mixer
        self.fp32_mixer = bool(fp32_mixer)
        self.mlp_norm = nn.LayerNorm(d_model) if use_mlp else None
        self.mlp = mlp(d_model) if use_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + run_mixer(self.mixer, self.norm(x), self.fp32_mixer)
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


class ZoologyBlock(nn.Module):
    """zoology's ``TransformerBlock``, which carries ``(hidden, residual)`` between blocks:
    ``r ← h + r``; ``h ← mixer(norm(r))``; ``r ← h + r``; ``h ← mlp(norm2(r))``, where the
    MLP is the identity when ``use_mlp`` is false (zoology's MQAR models), so ``norm2(r)``
    itself is added to the stream by the next block (or before the final norm). The first
    block gets ``r = None`` and starts from ``r ← h``; all ``(b, n, d_model)``.
    ``fp32_mixer``: the mixer runs in fp32 under autocast (:func:`run_mixer`)."""

    def __init__(self, mixer: nn.Module, d_model: int, use_mlp: bool, fp32_mixer: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.mixer = mixer
        self.fp32_mixer = bool(fp32_mixer)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = mlp(d_model) if use_mlp else None

    def forward(self, h: torch.Tensor,
                r: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        r = h if r is None else h + r
        r = run_mixer(self.mixer, self.norm(r), self.fp32_mixer) + r
        h = self.norm2(r)
        return (h if self.mlp is None else self.mlp(h)), r


def check_fp32_mixers(fp32_mixers: list[str] | tuple[str, ...] | None,
                      mixer_names: list[str]) -> list[str]:
    """``fp32_mixers`` as a list without repeats, in the model's layer order; ``ValueError`` for
    a name that is not one of the model's mixers."""
    names = list(fp32_mixers or ())
    unknown = [n for n in names if n not in mixer_names]
    if unknown:
        raise ValueError(f"fp32_mixers names {unknown[0]!r}, which is not one of this model's "
                         f"mixers {sorted(set(mixer_names))}")
    return [n for n in dict.fromkeys(mixer_names) if n in names]


def normal_init(model: nn.Module, std: float) -> None:
    """zoology's initialisation: every ``nn.Linear`` weight and the embedding N(0, std²), every
    linear bias 0, except the decay gates' biases, which keep their set decay rates
    (:class:`~arbench.mixers.DecayGate`). Convolutions, norms and feature-map parameters
    (LLoPS's Θ) keep their own initialisation."""
    gate_biases = {id(m.proj.bias) for m in model.modules() if isinstance(m, DecayGate)}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std)
            bias = getattr(module, "bias", None)
            if isinstance(module, nn.Linear) and bias is not None and id(bias) not in gate_biases:
                bias.zero_()


class RecallModel(nn.Module):
    """Token embedding (+ a learned embedding of each position ``0 …
    max_position_embeddings − 1`` when that is > 0, zoology's ``max_position_embeddings``) (→
    dropout when ``embedding_dropout`` > 0, training only) → ``n_layers`` blocks → final
    LayerNorm → LM head (tied by default). Without position embeddings (the default) only the
    convolutions and the causal order tell positions apart; a sequence longer than
    ``max_position_embeddings`` is a ``ValueError``.

    ``fp32_mixers``: names of ``mixers`` whose layers run in fp32 under autocast (e.g.
    ``["conv"]`` with ``--trainer.precision bf16-mixed``); no effect without autocast."""

    def __init__(self, vocab_size: int = 8192, d_model: int = 128,
                 n_layers: int = DEFAULT_N_LAYERS,
                 mixers: list[str] | tuple[str, ...] = ("conv", "linear"), num_heads: int = 1,
                 feature_map: FeatureMapFactory | None = None, normalize: bool | str = False,
                 output_norm: bool | None = None, chunk_size: int = 64,
                 attention_mode: str = "chunked", conv_kernel: int = 3, use_mlp: bool = False,
                 tie_embeddings: bool = True, qk_norm: bool = False, qk_dim: int | None = None,
                 attention_eps: float = 1e-6, block: str = "prenorm",
                 init_std: float | None = None, embedding_dropout: float = 0.0,
                 fp32_mixers: list[str] | tuple[str, ...] = (),
                 max_position_embeddings: int = 0):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                            ("n_layers", n_layers), ("num_heads", num_heads)):
            check_int(name, value)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
        if init_std is not None and not (isinstance(init_std, (int, float)) and init_std > 0):
            raise ValueError(f"init_std must be a positive number or null, got {init_std!r}")
        if not (isinstance(embedding_dropout, (int, float)) and 0 <= embedding_dropout < 1):
            raise ValueError(f"embedding_dropout must be a number in [0, 1), "
                             f"got {embedding_dropout!r}")
        if not (isinstance(attention_eps, (int, float)) and attention_eps > 0):
            raise ValueError(f"attention_eps must be a positive number, got {attention_eps!r}")
        check_int("max_position_embeddings", max_position_embeddings, minimum=0)
        mixers = list(mixers)
        if not mixers or any(m not in MIXER_NAMES for m in mixers):
            raise ValueError(f"mixers must be a non-empty list of {MIXER_NAMES}, got {mixers!r}")
        needs_map = [m for m in mixers if m in FEATURE_MIXERS]
        if needs_map and feature_map is None:
            raise ValueError(f"mixers include {needs_map[0]!r} but no feature_map was given")
        self.vocab_size, self.d_model = vocab_size, d_model
        self.mixer_names = [mixers[i % len(mixers)] for i in range(n_layers)]
        self.fp32_mixers = check_fp32_mixers(fp32_mixers, self.mixer_names)

        def build(name: str) -> nn.Module:
            cls = MIXERS[name]
            if name not in FEATURE_MIXERS and name != "softmax":  # the convolutions
                return cls(d_model, conv_kernel)
            if name not in FEATURE_MIXERS:
                return cls(d_model, num_heads)
            eps = dict(eps=attention_eps) if issubclass(cls, LinearAttention) else {}
            return cls(d_model, num_heads, feature_map, normalize=normalize,
                       output_norm=output_norm, chunk_size=chunk_size, mode=attention_mode,
                       qk_norm=qk_norm, qk_dim=qk_dim, **eps)

        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.max_position_embeddings = max_position_embeddings
        self.position_embed = None
        if max_position_embeddings > 0:
            self.position_embed = nn.Embedding(max_position_embeddings, d_model)
            nn.init.normal_(self.position_embed.weight, std=0.02)
        # zoology's embedding dropout (training only); none by default, so no RNG is drawn
        self.embed_dropout = nn.Dropout(embedding_dropout) if embedding_dropout > 0 else None
        self.block = block
        block_cls = ZoologyBlock if block == "zoology" else Block
        self.blocks = nn.ModuleList(block_cls(build(n), d_model, use_mlp, n in self.fp32_mixers)
                                    for n in self.mixer_names)
        self.final_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        if init_std is not None:
            normal_init(self, init_std)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final normalised hidden states ``(b, n, d_model)`` of ``input_ids`` ``(b, n)``."""
        x = self.embed(input_ids)
        if self.position_embed is not None:
            n = input_ids.shape[-1]
            self.check_positions(n)
            x = x + self.position_embed.weight[:n]
        if self.embed_dropout is not None:
            x = self.embed_dropout(x)
        if self.block == "zoology":
            residual = None
            for block in self.blocks:
                x, residual = block(x, residual)
            x = x + residual
        else:
            for block in self.blocks:
                x = block(x)
        return self.final_norm(x)

    def check_positions(self, seq_len: int) -> None:
        """Raise ``ValueError`` when position embeddings are on and ``seq_len`` exceeds them."""
        if 0 < self.max_position_embeddings < seq_len:
            raise ValueError(f"a sequence of {seq_len} tokens is longer than "
                             f"model.max_position_embeddings={self.max_position_embeddings}; "
                             f"raise it to the longest seq_len of the data (or 0: none)")

    def compile_body(self) -> None:
        """Run :meth:`hidden` through ``torch.compile`` from now on (idempotent; weights and
        ``state_dict`` are unchanged, so checkpoints load into eager or compiled models)."""
        if "hidden" not in self.__dict__:
            self.hidden = torch.compile(self.hidden, dynamic=False)  # one graph per shape

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits at every position, ``(b, n, vocab_size)`` (inference)."""
        return self.head(self.hidden(input_ids))

    def answer_logits(self, input_ids: torch.Tensor,
                      labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits only where ``labels != IGNORE_INDEX`` (the training path).

        Returns ``(logits (k, vocab), targets (k,), row (k,))`` for the k scored positions;
        ``row`` is the example each position belongs to.
        """
        hidden = self.hidden(input_ids)
        mask = labels != IGNORE_INDEX
        rows = mask.nonzero(as_tuple=True)[0]
        return self.head(hidden[mask]), labels[mask], rows

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over answer positions."""
        logits, targets, _ = self.answer_logits(input_ids, labels)
        return F.cross_entropy(logits.float(), targets)

    def state_size(self, seq_len: int) -> int:
        """Floats of recurrent state over all layers when generating ``seq_len`` tokens."""
        return sum(b.mixer.state_size(seq_len) for b in self.blocks)

    def attention_hparams(self) -> dict[str, float | int | str | bool]:
        """Hyperparameters of the first attention layer (feature map, m, p, rank, ...)."""
        for block in self.blocks:
            if hasattr(block.mixer, "hparams"):
                return block.mixer.hparams()
        return {"feature_map": "none"}
