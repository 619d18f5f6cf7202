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
from arbench.bench.targets import summary_lines
from arbench.checks import OneLineParser, check_writable
from arbench.options import add_options, given


def parser() -> argparse.ArgumentParser:
    """``--smoke`` and one option per option field of :class:`BenchConfig`."""
    ap = OneLineParser(prog="python -m arbench.bench", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (seconds)")
    add_options(ap, BenchConfig)
    return ap


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The smoke or default profile, overridden by the options given."""
    cfg = replace(smoke_config() if args.smoke else BenchConfig(), **given(args, BenchConfig))
    try:
        device = torch.device(cfg.device)
    except RuntimeError:
        raise ValueError(f"--device {cfg.device}: not a torch device (e.g. cpu, cuda, "
                         "cuda:0)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {cfg.device}: CUDA is not available here")
    return cfg


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, run the benchmark, print the target checks; returns the result dict."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
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
    print("in the layer timings' rounds (the fractions' reference): " + ", ".join(
        f"{name} {r['median']:.1f} GFLOP/s" for name, r in result["matmul_interleaved"].items()))
    print("\n".join(summary_lines(result)))
    return result


if __name__ == "__main__":
    main()
