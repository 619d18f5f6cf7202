"""Settings of one benchmark run: the layer grid, the training sizes, the smoke profile."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

import torch


@dataclass(frozen=True)
class TrainSpec:
    """One RecallModel size for the training-throughput measurement (2 layers: conv, linear)."""

    name: str
    vocab: int
    d_model: int
    m: int
    p: int
    batch: int
    seq: int
    pairs: int


P4_TRAIN = TrainSpec("p4", vocab=8192, d_model=128, m=256, p=4, batch=64, seq=64, pairs=4)
CPU_TRAIN = TrainSpec("cpu", vocab=512, d_model=128, m=256, p=4, batch=64, seq=64, pairs=8)
SMOKE_TRAIN = (TrainSpec("p4", vocab=64, d_model=16, m=16, p=4, batch=4, seq=32, pairs=4),
               TrainSpec("cpu", vocab=32, d_model=8, m=8, p=2, batch=4, seq=32, pairs=4))


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run depends on. Sizes: ``seq_lens`` tokens, ``head_dim``/``m`` per head.

    ``repeats``: timed rounds (each round visits every case once, methods in rotated order).
    ``min_sample_s``: a timed sample loops a case until it lasts at least this long (seconds).
    ``chunk_sizes``: candidates for the chunked form; with several, the fastest at
    ``tune_n`` tokens is used. ``cp_block_rows``: candidates for the rows per block of the
    CP-polynomial feature maps (``arbench.kernels.cp_block_rows``; 0 = one block), tuned
    the same way on the LLoPS layers (CPU only). ``train_samples``: timed steps per training
    size and head.
    ``softmax_bwd_max_n``: softmax forward+backward is skipped above this n (on 2 CPU cores
    SDPA's backward takes ~10 s at n = 16384); 0 = never skipped.
    ``normalize``: the linear layers' denominator; ``"none"`` is the recall model's default.
    ``compile``: linear methods that also run through ``torch.compile`` (as ``<name>_compiled``,
    plus an ``answer_compiled`` training head); ``("all",)`` = every linear method.
    ``rules``: state updates timed beside the additive one, on the ``rule_base`` method's
    feature maps (as ``<rule>_<base>``): ``gated`` (decaying state), ``delta`` and
    ``gated_delta`` (the delta rule, f and g L2-normalised as the mixers do).
    ``bf16``: methods that also run under bf16 autocast (as ``<name>_bf16``, plus an
    ``answer_bf16`` training head and the bf16 matmul reference); ``("all",)`` = every method.
    """

    seq_lens: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    batch: int = 1
    heads: int = 1
    head_dim: int = 128
    m: int = 256
    ps: tuple[int, ...] = (2, 4, 6)
    ranks: tuple[int, ...] = (1, 4)
    based_r: int = 16
    baseline_p: int = 4
    chunk_sizes: tuple[int, ...] = (64, 128, 256)
    tune_n: int = 8192
    cp_block_rows: tuple[int, ...] = (0, 512, 1024, 2048)
    normalize: str = "none"
    softmax_bwd_max_n: int = 4096
    device: str = field(default_factory=default_device)
    repeats: int = 5
    min_sample_s: float = 0.05
    matmul_size: int = 4096
    matmul_repeats: int = 7
    check_n: int = 256
    methods: tuple[str, ...] = ()
    compile: tuple[str, ...] = ()
    bf16: tuple[str, ...] = ()
    rules: tuple[str, ...] = ("gated", "delta", "gated_delta")
    rule_base: str = "llops_p2_t1"
    memory: bool = True
    train: bool = True
    train_specs: tuple[TrainSpec, ...] = (P4_TRAIN, CPU_TRAIN)
    train_samples: int = 8
    out_dir: str = "results/bench"
    seed: int = 0
    smoke: bool = False


def smoke_config(**overrides: object) -> BenchConfig:
    """Tiny sizes, one repeat: seconds on a CPU (tests, CI)."""
    base = BenchConfig(seq_lens=(64, 128), head_dim=16, m=16, based_r=4, chunk_sizes=(16, 32),
                       cp_block_rows=(0, 32),
                       tune_n=128, repeats=1, min_sample_s=0.0, matmul_size=256,
                       matmul_repeats=3, check_n=48, train_specs=SMOKE_TRAIN, train_samples=1,
                       out_dir="results/bench_smoke", smoke=True)
    return replace(base, **overrides)


def config_to_dict(cfg: BenchConfig) -> dict:
    """JSON-ready dict of ``cfg`` (train specs as dicts)."""
    return asdict(cfg)


def config_from_dict(data: dict) -> BenchConfig:
    """Inverse of ``config_to_dict``."""
    kwargs = {}
    for f in fields(BenchConfig):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name == "train_specs":
            value = tuple(TrainSpec(**s) for s in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return BenchConfig(**kwargs)
