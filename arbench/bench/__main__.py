"""Command line: ``python -m arbench.bench [--smoke] [options]``."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace

import torch

from arbench.bench.config import BenchConfig, smoke_config
from arbench.bench.layers import method_list
from arbench.bench.run import run_benchmark
from arbench.checks import check_writable

# options whose BenchConfig field has another name; every other option has its field's name
_RENAMES = {"p": "ps", "out": "out_dir"}
_OPTIONS = ("seq_lens", "batch", "heads", "head_dim", "m", "p", "ranks", "based_r", "baseline_p",
            "chunk_sizes", "tune_n", "cp_block_rows", "normalize", "softmax_bwd_max_n", "device",
            "repeats", "min_sample_s", "matmul_size", "methods", "train_samples", "out", "seed")
_TUPLES = {"seq_lens", "p", "ranks", "chunk_sizes", "cp_block_rows", "methods"}
# lower bounds of the numeric options (0 means something for the second group)
_AT_LEAST = {**dict.fromkeys(("seq_lens", "batch", "heads", "head_dim", "m", "p", "ranks",
                              "based_r", "baseline_p", "chunk_sizes", "tune_n", "repeats",
                              "matmul_size", "train_samples"), 1),
             **dict.fromkeys(("cp_block_rows", "softmax_bwd_max_n", "min_sample_s"), 0)}


def parser() -> argparse.ArgumentParser:
    """Options; every default is None so that only the options given override the profile."""
    d = BenchConfig()
    ap = argparse.ArgumentParser(prog="python -m arbench.bench", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (seconds)")
    ap.add_argument("--seq-lens", type=int, nargs="+", help=f"tokens (default {d.seq_lens})")
    ap.add_argument("--batch", type=int, help=f"batch size (default {d.batch})")
    ap.add_argument("--heads", type=int, help=f"heads (default {d.heads})")
    ap.add_argument("--head-dim", type=int, help=f"head dim d (default {d.head_dim})")
    ap.add_argument("--m", type=int, help=f"features m of LLoPS/Flatten/PolySketch (default {d.m})")
    ap.add_argument("--p", type=int, nargs="+", help=f"LLoPS degrees (default {d.ps})")
    ap.add_argument("--ranks", type=int, nargs="+", help=f"LLoPS CP ranks t (default {d.ranks})")
    ap.add_argument("--based-r", type=int, help=f"BASED r (default {d.based_r})")
    ap.add_argument("--baseline-p", type=int, help=f"Flatten/PolySketch p (default {d.baseline_p})")
    ap.add_argument("--chunk-sizes", type=int, nargs="+",
                    help=f"chunk sizes to tune over; one value = no tuning (default {d.chunk_sizes})")
    ap.add_argument("--tune-n", type=int,
                    help=f"tokens for chunk and block tuning (default {d.tune_n})")
    ap.add_argument("--cp-block-rows", type=int, nargs="+",
                    help="rows per block of the LLoPS/PolySketch feature maps to tune over "
                         f"(0 = one block); one value = no tuning (default {d.cp_block_rows})")
    ap.add_argument("--normalize", choices=["signed", "abs", "none"],
                    help=f"denominator of the linear layers (default {d.normalize})")
    ap.add_argument("--softmax-bwd-max-n", type=int,
                    help=f"skip softmax forward+backward above this n; 0 = never "
                         f"(default {d.softmax_bwd_max_n})")
    ap.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    ap.add_argument("--repeats", type=int, help=f"timed rounds (default {d.repeats})")
    ap.add_argument("--min-sample-s", type=float,
                    help=f"minimum seconds per timed sample (default {d.min_sample_s})")
    ap.add_argument("--matmul-size", type=int, help=f"matmul reference size (default {d.matmul_size})")
    ap.add_argument("--methods", nargs="+", help="only these methods (e.g. llops_p4_t1 softmax)")
    ap.add_argument("--compile", nargs="*", metavar="METHOD",
                    help="also time these linear methods (none named: all) through torch.compile, "
                         "as <name>_compiled, and a compiled training step")
    ap.add_argument("--bf16", nargs="*", metavar="METHOD",
                    help="also time these methods (none named: all) under bf16 autocast, as "
                         "<name>_bf16, with the bf16 matmul reference and a bf16 training step")
    ap.add_argument("--train-samples", type=int,
                    help=f"timed training steps per size and head (default {d.train_samples})")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--no-train", action="store_true", help="skip the training throughput")
    ap.add_argument("--out", help=f"output directory (default {d.out_dir}; smoke: results/bench_smoke)")
    ap.add_argument("--seed", type=int, help=f"seed (default {d.seed})")
    return ap


def check_args(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` naming the option for a size below its bound (:data:`_AT_LEAST`)."""
    for opt, low in _AT_LEAST.items():
        value = getattr(args, opt)
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            if v < low:
                raise ValueError(f"--{opt.replace('_', '-')} must be >= {low}, got {v}")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The smoke or default profile, overridden by the options given."""
    cfg = smoke_config() if args.smoke else BenchConfig()
    changes = {}
    for opt in _OPTIONS:
        value = getattr(args, opt)
        if value is not None:
            changes[_RENAMES.get(opt, opt)] = tuple(value) if opt in _TUPLES else value
    if args.no_memory:
        changes["memory"] = False
    if args.no_train:
        changes["train"] = False
    if args.compile is not None:
        changes["compile"] = tuple(args.compile) or ("all",)
    if args.bf16 is not None:
        changes["bf16"] = tuple(args.bf16) or ("all",)
    cfg = replace(cfg, **changes)
    if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device}: CUDA is not available here")
    return cfg


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, run the benchmark, print the target checks; returns the result dict."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        check_args(args)
        cfg = config_from_args(args)
        method_list(cfg)  # unknown --methods / --compile names
        check_writable(cfg.out_dir, "--out")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    result = run_benchmark(cfg, command=shlex.join(["python", "-m", "arbench.bench", *argv]))
    print(f"\nfp32 matmul: {result['matmul']['median']:.1f} GFLOP/s")
    if result["matmul_bf16"]:
        print(f"bf16 matmul: {result['matmul_bf16']['median']:.1f} GFLOP/s")
    for check in result["targets"]["checks"]:
        print(f"[{check['verdict']}] {check['target']}: {check['measured']}")
    return result


if __name__ == "__main__":
    main()
