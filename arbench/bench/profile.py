"""Where the time goes: ``python -m arbench.bench.profile [--out results/bench] [--steps N] [--bf16]``.

Runs ``torch.profiler`` over a few calls of each case and writes ``profile.md`` (and
``profile.json``): per case, the self CPU time of every operator grouped into

- ``matmul``: ``mm``/``bmm``/``addmm``/``addmm_``/``baddbmm``/``linear`` (their FLOP/s is shown; it is
  what the benchmark's fraction-of-peak is made of),
- ``elementwise``: pointwise arithmetic and reductions (``mul``, ``add``, ``sum``, ``pow``,
  norms, activations, the optimizer's ``_foreach`` updates) — memory-bound on a CPU,
- ``memory``: copies, concatenation, stacking, fills, allocation (``copy_``, ``cat``,
  ``stack``, ``zeros``, ``empty``, ``clone``, ``contiguous``, padding),
- ``other``: everything else (indexing, embedding, cross-entropy, autograd bookkeeping),

plus the top operators. Cases: one training step of the RecallModel at each of the
benchmark's training sizes (``p4``, ``cpu``, ``long``; answer head), and one attention layer
forward and forward+backward at n = 8192 for LLoPS (p = 4, t = 1 and p = 6, t = 4, m = 256),
BASED (r = 16) and Flatten (p = 4, m = 256), d = 128, chunk 128 (``--chunk``; the size
``python -m arbench.bench`` picked); n = 8192, where the profiled and benchmarked times agreed
(results/kernels.md). ``--bf16``: every case under
bf16 autocast (fp32 weights, as ``--trainer.precision bf16-mixed`` trains), read against the
bf16 matmul reference; the output files get a ``_bf16`` suffix.

The matmul rate of a case bounds its fraction of peak: were every other operator free, the
case would run at that rate (its FLOPs are almost all in the matmuls).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from arbench.bench.config import CPU_TRAIN, LONG_TRAIN, P4_TRAIN, BenchConfig
from arbench.bench.layers import build_layer, make_call, make_inputs, method_list
from arbench.bench.timing import matmul_throughput
from arbench.bench.training import build_model, make_step
from arbench.checks import OneLineParser
from arbench.data.mqar import generate_mqar
from arbench.kernels import keep_heap
from arbench.optim import make_adamw
from arbench.options import add_options, given, opt

MATMUL = ("aten::mm", "aten::bmm", "aten::addmm", "aten::addmm_", "aten::baddbmm",
          "aten::linear", "aten::matmul")
MEMORY = ("copy_", "cat", "stack", "zeros", "empty", "clone", "contiguous", "fill_", "zero_",
          "pad", "constant_pad_nd", "to", "_to_copy", "new_zeros", "ones", "index_put",
          "resize_", "as_strided_scatter", "expand_as")
ELEMENTWISE = ("mul", "add", "sub", "div", "sum", "pow", "rsqrt", "sqrt", "mean", "exp",
               "neg", "sigmoid", "silu", "gelu", "relu", "tanh", "_foreach", "lerp", "addcmul",
               "addcdiv", "maximum", "where", "masked_fill", "cumsum", "norm", "rms_norm",
               "square", "reciprocal", "abs", "sign", "clamp", "tril", "triu")


def category(name: str) -> str:
    """``matmul``, ``memory``, ``elementwise`` or ``other`` for an operator name ``aten::x``."""
    if name in MATMUL:
        return "matmul"
    base = name.removeprefix("aten::").rstrip("_") if name.startswith("aten::") else ""
    if not base:
        return "other"
    if any(base == m.rstrip("_") for m in MEMORY):
        return "memory"
    if any(base == e or base.startswith(e) for e in ELEMENTWISE):
        return "elementwise"
    return "other"


def _flops(ev: object) -> float:
    """The profiler's FLOP count of an event group, and ``2·M·K·N`` per ``addmm_`` call
    (the in-place form, which the profiler does not count; shapes: self, mat1, mat2)."""
    if ev.key == "aten::addmm_" and len(ev.input_shapes) >= 3:  # type: ignore[attr-defined]
        (m, k), (_, n) = ev.input_shapes[1][:2], ev.input_shapes[2][:2]  # type: ignore[attr-defined]
        return 2.0 * m * k * n * ev.count  # type: ignore[attr-defined]
    return float(ev.flops or 0)  # type: ignore[attr-defined]


def profile_case(fn: Callable[[], None], calls: int) -> dict:
    """Warm ``fn`` up twice, profile ``calls`` calls; per-call ms by category and top operators."""
    fn(), fn()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
        for _ in range(calls):
            fn()
    merged: dict[str, dict] = {}
    for ev in prof.key_averages(group_by_input_shape=True):
        # self time only, so nested aten calls are not counted twice
        if ev.self_cpu_time_total <= 0:
            continue
        op = merged.setdefault(ev.key, {"op": ev.key, "self_ms": 0.0, "calls": 0, "gflop": 0.0,
                                        "category": category(ev.key)})
        op["self_ms"] += ev.self_cpu_time_total / 1e3 / calls
        op["calls"] += ev.count // calls
        op["gflop"] += _flops(ev) / 1e9 / calls
    ops = list(merged.values())
    ops.sort(key=lambda o: o["self_ms"], reverse=True)
    total = sum(o["self_ms"] for o in ops)
    by_cat = {c: sum(o["self_ms"] for o in ops if o["category"] == c)
              for c in ("matmul", "elementwise", "memory", "other")}
    mm_ms = by_cat["matmul"]
    mm_gflop = sum(o["gflop"] for o in ops if o["category"] == "matmul")
    return {"total_ms": total, "by_category_ms": by_cat, "matmul_gflop": mm_gflop,
            "matmul_gflops": mm_gflop / (mm_ms / 1e3) if mm_ms > 0 else float("nan"),
            "top": ops[:12]}


def cases(steps: int, n: int, chunk: int,
          bf16: bool = False) -> dict[str, tuple[Callable[[], None], int]]:
    """Name → (callable, calls to profile); under bf16 autocast when ``bf16``."""
    out: dict[str, tuple[Callable[[], None], int]] = {}
    for spec in (P4_TRAIN, CPU_TRAIN, LONG_TRAIN):
        model = build_model(spec, "cpu")
        opt = make_adamw(model.parameters(), lr=1e-3, weight_decay=0.1)
        x, labels = generate_mqar(spec.batch, spec.seq, spec.pairs, spec.vocab, seed=0)
        head = "answer_bf16" if bf16 else "answer"
        out[f"{spec.name} training step ({head} head)"] = (
            make_step(model, opt, x, labels, head), steps)
    cfg = BenchConfig(device="cpu")
    inputs = make_inputs(cfg, n)
    names = ("llops_p4_t1", "llops_p6_t4", f"based_r{cfg.based_r}", f"flatten_p{cfg.baseline_p}")
    for method in method_list(replace(cfg, methods=names, bf16=("all",) if bf16 else ())):
        if method.bf16 != bf16:
            continue
        layer = build_layer(method, cfg, chunk)
        for pass_ in ("fwd", "fwd_bwd"):
            out[f"{method.name} layer {pass_}, n={n}"] = (make_call(layer, inputs, pass_), 2)
    return out


def markdown(result: dict) -> str:
    """``profile.md`` from the result dict."""
    lines = ["# Where the time goes (torch.profiler, self CPU time per call)", "",
             f"- command: `{result['command']}`",
             f"- {result['threads']} threads, torch {result['torch']}, CPU allocator: "
             + ("glibc heap kept (`arbench.kernels.allocator`)" if result["heap_kept"] else "system"),
             f"- {result.get('dtype', 'fp32')} matmul reference: {result['peak_gflops']:.1f} "
             "GFLOP/s (4096², median of 5)",
             f"- layer cases: chunk {result['chunk']}",
             "- Profiling adds overhead per operator call; shares are what to read, not totals.",
             "- The last column bounds a case's fraction of peak: were every other operator "
             "free, the case would run at its matmul rate.", ""]
    lines += ["| case | total ms | matmul | elementwise | memory | other | matmul GFLOP/s "
              "(of peak) |", "|---|---|---|---|---|---|---|"]
    for name, r in result["cases"].items():
        c, tot = r["by_category_ms"], r["total_ms"]
        shares = " | ".join(f"{c[k]:.1f} ({c[k] / tot:.0%})"
                            for k in ("matmul", "elementwise", "memory", "other"))
        lines.append(f"| {name} | {tot:.1f} | {shares} | {r['matmul_gflops']:.0f} "
                     f"({r['matmul_gflops'] / result['peak_gflops']:.0%}) |")
    lines.append("")
    for name, r in result["cases"].items():
        lines += [f"## {name}", "", "| operator | category | self ms per call | calls | GFLOP |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{o['op']}` | {o['category']} | {o['self_ms']:.2f} | {o['calls']} | "
                  f"{o['gflop']:.2f} |" for o in r["top"]]
        lines.append("")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProfileConfig:
    """The options of ``python -m arbench.bench.profile`` (:mod:`arbench.options`)."""

    out: str = opt("results/bench", help="output directory")
    steps: int = opt(5, help="training steps profiled", at_least=1)
    n: int = opt(8192, help="tokens of the layer cases", at_least=1)
    chunk: int = opt(128, help="chunk size of the layer cases (what the committed benchmark "
                               "run picked)", at_least=1)
    bf16: bool = opt(False, help="every case under bf16 autocast, read against the bf16 matmul "
                                 "reference (files profile_bf16.md / .json)")


def main(argv: list[str] | None = None) -> dict:
    ap = OneLineParser(prog="python -m arbench.bench.profile", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(ap, ProfileConfig)
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = ProfileConfig(**given(ap.parse_args(argv), ProfileConfig))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    heap_kept = keep_heap()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    peak = matmul_throughput("cpu", 4096, 5, dtype=dtype)["median"]
    result = {"command": "python -m arbench.bench.profile" + (f" {' '.join(argv)}" if argv else ""),
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "heap_kept": heap_kept, "peak_gflops": peak, "chunk": args.chunk,
              "dtype": "bf16" if args.bf16 else "fp32", "cases": {}}
    for name, (fn, calls) in cases(args.steps, args.n, args.chunk, args.bf16).items():
        result["cases"][name] = profile_case(fn, calls)
        print(f"profiled {name}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "profile_bf16" if args.bf16 else "profile"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    print(f"wrote {out}/{stem}.md")
    return result


if __name__ == "__main__":
    main()
