"""Settings of one benchmark run: the layer grid, the training sizes, the smoke profile."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import torch

from arbench.options import opt


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
LONG_TRAIN = TrainSpec("long", vocab=2048, d_model=128, m=256, p=4, batch=64, seq=256, pairs=32)
"""The ``long`` profile's most common training batch (256 tokens; 60k of its 105k examples)."""
SMOKE_TRAIN = (TrainSpec("p4", vocab=64, d_model=16, m=16, p=4, batch=4, seq=32, pairs=4),
               TrainSpec("cpu", vocab=32, d_model=8, m=8, p=2, batch=4, seq=32, pairs=4),
               TrainSpec("long", vocab=64, d_model=8, m=8, p=2, batch=2, seq=64, pairs=8))


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class BenchConfig:
    """Everything a run depends on; the fields with a help text are the options of
    ``python -m arbench.bench`` (:mod:`arbench.options`). Sizes: ``seq_lens`` tokens,
    ``head_dim``/``m`` per head. A timed round visits every case once, methods in rotated
    order; linear twins: ``<name>_compiled`` (``compile``), ``<name>_bf16`` (``bf16``), and
    ``<rule>_<rule_base>`` for each state update in ``rules``."""

    seq_lens: tuple[int, ...] = opt((1024, 2048, 4096, 8192, 16384), help="tokens", at_least=1)
    batch: int = opt(1, help="batch size", at_least=1)
    heads: int = opt(1, help="heads", at_least=1)
    head_dim: int = opt(128, help="head dim d", at_least=1)
    m: int = opt(256, help="features m of LLoPS/Flatten/PolySketch", at_least=1)
    ps: tuple[int, ...] = opt((2, 4, 6), help="LLoPS degrees", flag="--p", at_least=1)
    ranks: tuple[int, ...] = opt((1, 4), help="LLoPS CP ranks t", at_least=1)
    based_r: int = opt(16, help="BASED r", at_least=1)
    baseline_p: int = opt(4, help="Flatten/PolySketch p", at_least=1)
    chunk_sizes: tuple[int, ...] = opt(
        (64, 128, 256), at_least=1,
        help="chunk sizes of the chunked form to tune over (the fastest at --tune-n tokens is "
             "used); one value = no tuning")
    tune_n: int = opt(8192, help="tokens for chunk and block tuning", at_least=1)
    cp_block_rows: tuple[int, ...] = opt(
        (0, 512, 1024, 2048), at_least=0,
        help="rows per block of the LLoPS/PolySketch feature maps to tune over on a CPU "
             "(arbench.kernels.cp_block_rows; 0 = one block); one value = no tuning")
    normalize: str = opt("none", help="denominator of the linear layers (none: the recall "
                                      "model's default)", choices=("signed", "abs", "none"))
    softmax_bwd_max_n: int = opt(4096, at_least=0,
                                 help="skip softmax forward+backward above this n; 0 = never")
    device: str = opt(help="cpu, cuda, cuda:1, ...", default_factory=default_device)
    repeats: int = opt(5, help="timed rounds", at_least=1)
    min_sample_s: float = opt(0.05, at_least=0,
                              help="a timed sample loops a case until it lasts this long (s)")
    matmul_size: int = opt(4096, help="matmul reference size", at_least=1)
    matmul_repeats: int = 7
    check_n: int = 256
    methods: tuple[str, ...] = opt((), help="only these methods (e.g. llops_p4_t1 softmax)")
    method_configs: tuple[str, ...] = opt(
        (), flag="--method-config", repeat=True,
        help="also benchmark the feature map of this method config (its model.feature_map "
             "block, e.g. configs/p4.yaml; repeatable), named by its run name; with it only "
             "the --methods named run beside it")
    compile: tuple[str, ...] = opt(
        (), nargs="*", if_empty=("all",),
        help="also time these linear methods (none named: all) through torch.compile, as "
             "<name>_compiled, and a compiled training step")
    bf16: tuple[str, ...] = opt(
        (), nargs="*", if_empty=("all",),
        help="also time these methods (none named: all) under bf16 autocast, as <name>_bf16, "
             "with the bf16 matmul reference and a bf16 training step")
    rules: tuple[str, ...] = ("gated", "delta", "gated_delta")
    rule_base: str = "llops_p2_t1"
    memory: bool = opt(True, help="measure peak memory")
    train: bool = opt(True, help="measure the training throughput")
    train_specs: tuple[TrainSpec, ...] = (P4_TRAIN, CPU_TRAIN, LONG_TRAIN)
    train_samples: int = opt(8, help="timed training steps per size and head", at_least=1)
    out_dir: str = opt("results/bench", help="output directory (smoke: results/bench_smoke)",
                       flag="--out")
    seed: int = opt(0, help="seed")
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
