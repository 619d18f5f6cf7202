"""Command line: ``python -m arbench.approx (--teacher CKPT | --qk FILE | --synthetic) ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from arbench.approx.extract import extract_from_teacher, load_teacher, softmax_layers
from arbench.approx.fit import FitConfig
from arbench.approx.ledger import LEDGER_NAME, Ledger, key
from arbench.approx.polish import PolishConfig
from arbench.approx.qkset import QKSet, load_qk, save_qk
from arbench.approx.report import markdown_table, remove_report, write_report
from arbench.approx.starts import LLOPS_STARTS, StartConfig
from arbench.approx.study import (
    METHOD_KEYS,
    StudyConfig,
    check_settings,
    check_val_seqs,
    run_study,
)
from arbench.approx.synthetic import synthetic_qk
from arbench.checks import OneLineParser, check_int, check_writable
from arbench.options import add_options, given, opt
from arbench.registry import load_method_config


@dataclass(frozen=True)
class ApproxConfig:
    """The command's settings; every field is an option (:mod:`arbench.options`). One source of
    queries and keys: ``teacher``, ``qk`` or ``synthetic``."""

    teacher: str | None = opt(None, help="LitRecall checkpoint of a softmax teacher")
    qk: str | None = opt(None, help="a saved extraction (.pt) instead of a teacher")
    synthetic: bool = opt(False, help="synthetic queries and keys")
    ps: tuple[int, ...] = opt((2, 3), help="kernel degrees", flag="--p")
    m: int = opt(64, help="feature dimension")
    layers: tuple[int, ...] = opt((), help="indices into model.blocks (default: every softmax "
                                           "/ stored layer)")
    heads: tuple[int, ...] = opt((), help="head indices (default: 0 / stored)")
    ranks: tuple[int, ...] = opt((1, 2, 4, 8), help="LLoPS CP ranks t")
    methods: tuple[str, ...] = opt(METHOD_KEYS, help="methods to fit", choices=METHOD_KEYS)
    method_configs: tuple[str, ...] = opt(
        (), flag="--method-config", repeat=True,
        help="also fit the feature map of this method config (its model.feature_map block, "
             "e.g. configs/p4.yaml; repeatable), a row named by its run name")
    out: str = opt("results/approx", help="output folder")
    steps: int = opt(2000, help="the most Adam steps per fit; a fit ends earlier once its "
                                "validation loss stops improving (seeded)")
    lrs: tuple[float, ...] = opt((1e-2, 3e-2), flag="--lr", help="learning rates; each fitted "
                                 "method keeps its lowest validation loss")
    batch: int = opt(512, help="queries and keys per step")
    init_ratio: float = opt(0.25, help="initial ‖Â‖/‖A‖ on the first batch (0: as built)")
    seed: int = opt(0, help="seed of the split and the fits")
    n_train: int = opt(4096, help="training tokens (q and k) per layer: the held-out split's "
                                  "training sequences first, then the --train-seqs ones")
    n_test: int = opt(1024, help="held-out tokens (q and k)")
    train_seqs: int = opt(32, help="extra training-only sequences (teacher: MQAR seed "
                                   "--train-seed; synthetic: drawn after the others); the "
                                   "held-out pairs do not depend on them")
    train_seed: int = opt(10_001, help="MQAR seed of the --train-seqs sequences (teacher)")
    data_start: bool = opt(True, help="LLoPS starts from alternating least squares over its "
                                      "factors, BASED-style from the best rank-r bilinear "
                                      "projections; the other maps from the Adam fit")
    llops_start: str = opt("projection", choices=LLOPS_STARTS,
                           help="where LLoPS's ALS starts: the BASED-style best rank-r "
                                "projections' exact expansion written as rank-1 LLoPS factors, "
                                "or its random sketch")
    als_sweeps: int = opt(50, help="the most ALS sweeps of the LLoPS start (it ends earlier "
                                   "once a sweep gains < 1e-4 of the loss)")
    polish_steps: int = opt(200, help="the most full-batch L-BFGS steps after every start "
                                      "(0: off)")
    gtol: float = opt(1e-5, help="L-BFGS stops as stationary once the full-batch gradient "
                                 "norm of the relative loss is <= this")
    ftol: float = opt(1e-6, help="... or once 10 steps in a row each lowered the loss by "
                                 "less than this fraction")
    val_seqs: int = opt(0, help="hold back the last N of the --train-seqs sequences as "
                                "validation pairs: every fit (Adam, ALS, L-BFGS) keeps its "
                                "parameters of least loss on them (0: Adam holds back an eighth "
                                "of the training tokens; ALS and L-BFGS fit to their own rules)")
    mlp_hidden: int = opt(256, help="hidden width of the 2-layer MLP maps")
    explicit_max_dim: int = opt(20_000, help="build W* explicitly on ψ_p only up to this many "
                                             "rows")
    log_every: int = opt(0, help="loss line every N steps (0: off)")
    threads: int = opt(1, help="torch CPU threads (1 is fastest for these small fits on a "
                               "shared machine; 0 keeps torch's default)")
    num_seqs: int = opt(32, help="held-out sequences to run")
    seq_len: int = opt(128, help="sequence length")
    num_kv_pairs: int = opt(16, help="MQAR pairs (teacher)")
    data_seed: int = opt(10_000, help="MQAR seed (teacher)")
    head_dim: int = opt(16, help="head dim (synthetic)")
    save_qk: str | None = opt(None, help="also save the extraction here")

    def study(self) -> StudyConfig:
        """The study's configuration."""
        fit = FitConfig(steps=self.steps, lr=self.lrs[0], batch=self.batch, seed=self.seed,
                        init_ratio=self.init_ratio, log_every=self.log_every,
                        data_start=self.data_start, start=StartConfig(sweeps=self.als_sweeps,
                                                          llops_from=self.llops_start),
                        polish=PolishConfig(steps=self.polish_steps, gtol=self.gtol,
                                            ftol=self.ftol))
        return StudyConfig(ps=self.ps, m=self.m, ranks=self.ranks, fit=fit, lrs=self.lrs,
                           n_train=self.n_train, n_test=self.n_test, seed=self.seed,
                           mlp_hidden=self.mlp_hidden, explicit_max_dim=self.explicit_max_dim,
                           methods=self.methods, val_seqs=self.val_seqs,
                           method_configs=tuple(map(load_method_config, self.method_configs)))


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog="python -m arbench.approx",
        description="Kernel-approximation study: RMAE of m-dimensional feature maps against "
                    "(q·k)^p on a softmax teacher's queries and keys, with the Eckart–Young "
                    "floor and LLoPS at several CP ranks t.")
    add_options(ap, ApproxConfig)
    return ap


def parse(argv: Sequence[str] | None) -> ApproxConfig:
    """The configuration of ``argv``; ``ValueError`` unless exactly one source is given."""
    cfg = ApproxConfig(**given(build_parser().parse_args(argv), ApproxConfig))
    if [bool(cfg.teacher), bool(cfg.qk), cfg.synthetic].count(True) != 1:
        raise ValueError("give exactly one of --teacher, --qk, --synthetic")
    return cfg


def load_source(cfg: ApproxConfig) -> QKSet:
    """The queries and keys ``cfg`` asks for (teacher, saved file or synthetic)."""
    layers, heads = list(cfg.layers) or None, list(cfg.heads) or None
    if cfg.teacher:
        model = load_teacher(cfg.teacher)
        return extract_from_teacher(model, layers or softmax_layers(model), heads or [0],
                                    cfg.num_seqs, cfg.seq_len, cfg.num_kv_pairs, cfg.data_seed,
                                    checkpoint=str(cfg.teacher), train_seqs=cfg.train_seqs,
                                    train_seed=cfg.train_seed)
    if cfg.qk:
        return load_qk(cfg.qk).select(layers, heads)
    layers = layers if layers is not None else [0, 1, 2]
    return synthetic_qk(layers, head_dim=cfg.head_dim, num_seqs=cfg.num_seqs,
                        seq_len=cfg.seq_len, num_heads=max(heads or [0]) + 1,
                        seed=cfg.data_seed, train_seqs=cfg.train_seqs).select(layers,
                                                                               heads or [0])


def source(cfg: ApproxConfig, qk: QKSet) -> dict[str, object]:
    """Where the queries and keys came from, for the records file (:mod:`arbench.approx.ledger`)."""
    return {"meta": qk.meta, "layers": list(qk.layers), "heads": list(qk.heads),
            "qk": cfg.qk, "num_seqs": cfg.num_seqs, "seq_len": cfg.seq_len,
            "num_kv_pairs": cfg.num_kv_pairs, "data_seed": cfg.data_seed,
            "head_dim": cfg.head_dim, "train_only": qk.train_only, "train_seed": cfg.train_seed}


def notes(cfg: ApproxConfig, qk: QKSet, config: StudyConfig) -> list[str]:
    """The settings block printed above the tables."""
    meta = qk.meta
    src = {"teacher": f"teacher checkpoint `{meta.get('checkpoint')}`",
           "synthetic": "synthetic queries/keys (power-law spectra, see arbench/approx/synthetic.py)"}
    where = src.get(meta.get("source", ""), f"saved extraction `{cfg.qk}`")
    return [
        f"Source: {where}; layers {qk.layers}, heads {qk.heads}, head dim d = {qk.head_dim}.",
        f"m = {config.m} features; LLoPS CP ranks t = {list(config.ranks)}; p = {list(config.ps)}.",
        f"Held-out sequences are disjoint from the training ones; {config.n_train} training and "
        f"{config.n_test} held-out tokens (at most) per layer, the training ones from the split's "
        f"training sequences and {qk.train_only - config.val_seqs} training-only ones "
        f"(of {qk.train_only}, less the --val-seqs ones); every error is over all "
        if config.val_seqs else
        f"training sequences and {qk.train_only} training-only ones; every error is over all "
        "held-out (query, key) pairs, across sequences and in both orders (no causal mask).",
        "q and k are divided by √c, c = RMS of q·k over the training pairs, so (q·k)^p is O(1); "
        "the relative errors of the polynomial maps and of the floor do not depend on c.",
        "Fitted maps: a start, then full-batch L-BFGS in float32 (ALS runs in float64) on the "
        "loss ‖Â−A‖²_F/‖A‖²_F over all training pairs until stationary (stop: float32 "
        "gradient norm ≤ "
        f"{config.fit.polish.gtol:g}, or {config.fit.polish.patience} steps in a row each "
        f"gaining < {config.fit.polish.ftol:g} of the loss, or {config.fit.polish.steps} steps; "
        "start, steps, stop and the gradient norm at the stop per fit in table.csv). "
        + (f"Validation (--val-seqs {config.val_seqs}): all tokens of the last "
           f"{config.val_seqs} training-only sequences, which train nothing; every fit, the "
           "Adam fits, ALS and the polish, keeps its parameters of least loss on their pairs "
           f"(stop: {config.fit.patience} checks, {config.fit.patience} ALS sweeps or "
           f"{config.fit.polish.patience} L-BFGS steps without a new least; a grown CP rank "
           "keeps the rank-1 fit where it ends above it on that loss). "
           if config.val_seqs else "")
        + ("Starts: LLoPS from alternating least squares over its CP factors (each factor's "
           "subproblem is linear least squares, solved by conjugate gradients; at most "
           f"{config.fit.start.sweeps} sweeps a stage) from "
           + ("BASED-style's start below written as rank-1 LLoPS factors (each degree-p "
              "monomial of the r projections is a product of p linear forms)"
              if config.fit.start.llops_from == "projection" else "its sketch start")
           + ", a CP rank t > 1 rank 1 "
           "first and the other ranks grown from that fit (two stages; where the grown fit "
           "ends above the rank-1 stage on the ALS loss, "
           + ("the validation loss, " if config.val_seqs else "the training loss, ")
           + "the rank-1 fit is kept with the other ranks zero); BASED-style from the "
           "projections that make (qW_Q)·(kW_K) the best rank-r approximation of q·k on the "
           "training pairs; " if config.fit.data_start else "Starts: ")
        + f"MLP{'' if config.fit.data_start else ', LLoPS, BASED-style'} and Flatten from Adam "
        + ("until the validation loss stopped improving" if config.val_seqs else
           "until the loss on a held-back eighth of the training queries and keys stopped "
           "improving")
        + f" (lr /10 after 3 checks without a 1% gain, twice; at most "
        f"{config.fit.steps} steps), lr chosen per method and layer from "
        f"{list(config.lrs or (config.fit.lr,))} by that validation loss, "
        f"{config.fit.batch}×{config.fit.batch} pairs a step, seed {config.fit.seed}, estimate "
        f"rescaled at init to {config.fit.init_ratio}×‖A‖. PolySketchFormer is a fixed "
        "Gaussian sketch shared by q and k (unbiased, not fitted); Flatten"
        + (", and LLoPS where it starts from its sketch, start" if config.fit.data_start and
           config.fit.start.llops_from == "sketch" else
           " starts" if config.fit.data_start else " and LLoPS start")
        + " as that sketch (temperature 1, φ_K a copy of φ_Q). A stationary point need "
        "not be a map's best fit (see the floor and data-limit rows). The fits minimise the "
        "relative squared Frobenius error, not RMAE: of two maps, the one lower in one metric "
        "can be higher in the other.",
        "BASED-style: learned projections to r dims, then the exact degree-p expansion "
        "(C(r+p−1, p) ≤ m features): ((q W_Q)·(k W_K))^p.",
        "Eckart–Young floor: best rank-m approximation of the held-out A = (Q Kᵀ)^p; the RMAE "
        "table shows that truncated SVD's RMAE (not an RMAE floor), the Frobenius table the floor.",
        "Thm 3.1 W* (held-out): the explicit optimal linear sketch ψ_p(x) W* built on the held-out "
        "set itself (reaches the floor; only where C(d+p−1, p) ≤ "
        f"{config.explicit_max_dim}). Data limit, Thm 3.1 W* (train): W* = ψ_p(Q)⁺ U_m Σ_m^½ "
        "built on the training pairs (minimum-norm least squares, via Gram matrices) and "
        "applied to held-out: what the training data pin down of the optimal sketch; the "
        "column ÷ data limit divides each row's mean by it. It is one estimate from the "
        "training tokens, not a bound: a learned map can end below it (÷ data limit < 1).",
        "Paper columns: the paper's RMAE (SPEC §4) on layers 0 / 8 / 15 of its own softmax "
        "Transformer; its LLoPS is t = 1. Compare trends, not digits.",
    ]


TABLE_FILES = ("table.md", "table.csv")
"""The study's tables: a folder holding one of them but no records file was not written by
this version of the study (e.g. the committed ``results/approx``)."""


def check_own_folder(out: str | Path) -> None:
    """``ValueError`` (one line) if ``out`` holds the study's tables but no records file: they
    were written by another run or an older version, and this run would overwrite them."""
    folder = Path(out)
    found = [name for name in TABLE_FILES if (folder / name).exists()]
    if found and not (folder / LEDGER_NAME).exists():
        raise ValueError(f"--out {out} holds {' and '.join(found)} but no {LEDGER_NAME}: "
                         "written by another run or an older version; give another --out")


def run(argv: Sequence[str] | None = None) -> int:
    """Parse, run the study, write the outputs; raises ``ValueError`` for bad input."""
    cfg = parse(argv)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    config = cfg.study()
    check_settings(config)  # fail before any extraction work
    check_int("--train-seqs", cfg.train_seqs, minimum=0)
    if not cfg.qk:  # a saved extraction's training-only count is known once it is loaded
        check_val_seqs(cfg.val_seqs, cfg.train_seqs)
    check_writable(cfg.out, "--out")
    check_own_folder(cfg.out)
    if cfg.save_qk:
        check_writable(Path(cfg.save_qk).parent, "--save-qk")
    qk = load_source(cfg)
    if cfg.save_qk:
        print(f"saved queries/keys to {save_qk(qk, cfg.save_qk)}")

    def log(line: str) -> None:
        print(line, flush=True)

    ledger = Ledger(cfg.out, config, source(cfg, qk))
    if ledger.done:
        print(f"resuming: {len(ledger.done)} fits from {ledger.path}", flush=True)
    records = run_study(qk, config, log, ledger)
    print()
    print(markdown_table(records, "rmae"))
    print()
    # the file again: other processes may have added fits of other parts meanwhile
    recorded = Ledger(cfg.out, config, source(cfg, qk), repair=False).done
    outside = set(recorded) - {key(r) for r in records}
    if outside:
        layer, head, p, method = sorted(outside)[0]
        print(f"not writing {cfg.out}'s tables: {ledger.path} holds {len(outside)} fit(s) "
              f"outside this run's selection (e.g. {method} at layer {layer}, head {head}, "
              f"p = {p}), so they would show part of the study; a run of its whole selection "
              "(every layer, p, map and rank recorded) writes them, fitting only what is "
              "missing")
        stale = remove_report(cfg.out)
        if stale:
            print("removed " + ", ".join(str(p) for p in stale) + ": written before the file "
                  "held these fits, they no longer show all of it")
        return 0
    paths = write_report(records, cfg.out, notes(cfg, qk, config))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``error: <message>`` and exit status 2 for bad input, no traceback."""
    try:
        return run(argv)
    except (ValueError, FloatingPointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
