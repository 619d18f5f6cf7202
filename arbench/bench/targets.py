"""Speed targets and their PASS / MISS verdicts, from one run's result dict: every target's
threshold is a constant here, and every check states its target, the measured value and the
verdict (``n/a`` where the run did not measure it). ``bench.md`` and the command's summary
print these checks.
"""

from __future__ import annotations

import math

from arbench.bench.layers import PASSES
from arbench.bench.training import BF16_HEADS

FLOP_FRACTION_TARGET = 0.60
SOFTMAX_SPEEDUP_TARGET = 3.0
MEMORY_RATIO_TARGET = 2.2
BF16_STEP_SPEEDUP_TARGETS = {"cpu": 2.0, "long": 1.8}
"""bf16 training step tokens/s over fp32's, per training size (:mod:`arbench.bench.config`)."""
BF16_LAYER_FRACTION_TARGET = 0.40  # LLoPS layer forward+backward in bf16 at n = 4096
DELTA_FRACTION_TARGET = 0.40  # the chunked delta layer at n = 4096 (small triangular solves)
BASED_RANGE = (1000, 10000)  # the SPEC's throughput claim covers 1k–10k tokens
PASS_NAMES = {"fwd": "forward", "fwd_bwd": "forward+backward"}


def index_rows(rows: list[dict]) -> dict[tuple[str, int, str], dict]:
    return {(r["method"], r["n"], r["pass"]): r for r in rows}


def _linear_methods(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in rows if r["family"] != "softmax"))


def seq_lens(rows: list[dict]) -> list[int]:
    return sorted({r["n"] for r in rows})


def _check(target: str, measured: str, ok: bool | None) -> dict:
    verdict = "n/a" if ok is None else ("PASS" if ok else "MISS")
    return {"target": target, "measured": measured, "verdict": verdict}


def flop_fraction_checks(rows: list[dict]) -> list[dict]:
    """Every linear layer at n ≥ 4096 reaches ``FLOP_FRACTION_TARGET`` of matmul FLOP/s."""
    out = []
    for pass_ in PASSES:
        sel = [r for r in rows if r["family"] != "softmax" and r["n"] >= 4096 and r["pass"] == pass_]
        target = (f"linear layers, n ≥ 4096, {PASS_NAMES[pass_]}: ≥ {FLOP_FRACTION_TARGET:.0%} "
                  "of matmul FLOP/s")
        if not sel:
            out.append(_check(target, "no n ≥ 4096 in this run", None))
            continue
        worst = min(sel, key=lambda r: r["frac_peak"])
        best = max(sel, key=lambda r: r["frac_peak"])
        measured = (f"min {worst['frac_peak']:.0%} ({worst['method']}, n={worst['n']}), "
                    f"max {best['frac_peak']:.0%} ({best['method']}, n={best['n']})")
        out.append(_check(target, measured, worst["frac_peak"] >= FLOP_FRACTION_TARGET))
    return out


def based_ratios(rows: list[dict]) -> list[dict]:
    """Forward time and FLOP ratios LLoPS (t = 1) / BASED at every n."""
    idx, out = index_rows(rows), []
    based = next((r["method"] for r in rows if r["family"] == "based"), None)
    llops = [m for m in _linear_methods(rows) if m.startswith("llops") and m.endswith("_t1")]
    for method in llops if based else []:
        for n in seq_lens(rows):
            a, b = idx[(method, n, "fwd")], idx[(based, n, "fwd")]
            out.append({"method": method, "based": based, "n": n,
                        "time_ratio": a["median_ms"] / b["median_ms"],
                        "flop_ratio": a["gflop"] / b["gflop"]})
    return out


def based_checks(ratios: list[dict]) -> list[dict]:
    """SPEC claim: LLoPS forward faster than BASED over ``BASED_RANGE`` (time ratio < 1)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in ratios):
        sel = [r for r in ratios if r["method"] == method and
               BASED_RANGE[0] <= r["n"] <= BASED_RANGE[1]]
        target = (f"{method} forward faster than {ratios[0]['based']} at {_span(BASED_RANGE)} "
                  "(time ratio < 1)")
        if not sel:
            out.append(_check(target, f"no n in {_span(BASED_RANGE)} in this run", None))
            continue
        measured = "; ".join(f"n={r['n']}: {r['time_ratio']:.2f}× time, {r['flop_ratio']:.1f}× FLOPs"
                             for r in sel)
        out.append(_check(target, measured, all(r["time_ratio"] < 1 for r in sel)))
    return out


def softmax_comparison(rows: list[dict]) -> list[dict]:
    """Per linear method: forward speedup over softmax at the largest n, and the crossover n
    (smallest grid n from which on the linear layer's forward is faster)."""
    idx, ns = index_rows(rows), seq_lens(rows)
    if not any(r["family"] == "softmax" for r in rows):
        return []
    out = []
    for method in _linear_methods(rows):
        wins = [idx[("softmax", n, "fwd")]["median_ms"] > idx[(method, n, "fwd")]["median_ms"]
                for n in ns]
        cross = next((ns[i] for i in range(len(ns)) if all(wins[i:])), None)
        top = ns[-1]
        speedup = idx[("softmax", top, "fwd")]["median_ms"] / idx[(method, top, "fwd")]["median_ms"]
        out.append({"method": method, "n": top, "speedup": speedup, "crossover": cross,
                    "wins_from_start": bool(wins[0]) and cross == ns[0]})
    return out


def crossover_text(row: dict, ns: list[int]) -> str:
    if row["crossover"] is None:
        return f"> {ns[-1]} (softmax faster at the largest n)"
    if row["wins_from_start"]:
        return f"≤ {ns[0]} (linear faster at every n)"
    return str(row["crossover"])


def softmax_checks(comparison: list[dict]) -> list[dict]:
    """Chunked linear attention ``SOFTMAX_SPEEDUP_TARGET`` × faster than softmax (forward) at
    the largest n."""
    if not comparison:
        return [_check(f"linear vs softmax forward at the largest n: ≥ {SOFTMAX_SPEEDUP_TARGET:g}×",
                       "softmax not run", None)]
    n = comparison[0]["n"]
    worst = min(comparison, key=lambda r: r["speedup"])
    best = max(comparison, key=lambda r: r["speedup"])
    measured = (f"min {worst['speedup']:.2f}× ({worst['method']}), "
                f"max {best['speedup']:.2f}× ({best['method']})")
    return [_check(f"every linear layer vs softmax, forward at n={n}: ≥ "
                   f"{SOFTMAX_SPEEDUP_TARGET:g}× faster", measured,
                   worst["speedup"] >= SOFTMAX_SPEEDUP_TARGET)]


def memory_ratios(rows: list[dict]) -> list[dict]:
    """Peak memory at the largest n over the peak at half of it, per linear method and pass."""
    idx, ns = index_rows(rows), seq_lens(rows)
    top, half = ns[-1], ns[-1] // 2
    if half not in ns:
        return []
    out = []
    for method in _linear_methods(rows):
        for pass_ in PASSES:
            a, b = idx[(method, top, pass_)]["peak_mib"], idx[(method, half, pass_)]["peak_mib"]
            out.append({"method": method, "pass": pass_, "n": top, "half": half,
                        "peak_mib": a, "half_mib": b, "ratio": a / b if b > 0 else math.nan})
    return out


def memory_checks(ratios: list[dict]) -> list[dict]:
    """Chunked peak memory at the largest n ≤ ``MEMORY_RATIO_TARGET`` × the peak at half of
    it."""
    if not ratios or all(math.isnan(r["ratio"]) for r in ratios):
        return [_check(f"chunked peak memory at n_max ≤ {MEMORY_RATIO_TARGET:g} × at n_max/2",
                       "not measured (needs memory and both n)", None)]
    out = []
    for pass_ in PASSES:
        sel = [r for r in ratios if r["pass"] == pass_]
        worst = max(sel, key=lambda r: r["ratio"])
        target = (f"chunked peak memory, {PASS_NAMES[pass_]}: n={worst['n']} ≤ "
                  f"{MEMORY_RATIO_TARGET:g} × "
                  f"n={worst['half']}")
        measured = (f"max {worst['ratio']:.2f}× ({worst['method']}: {worst['peak_mib']:.1f} vs "
                    f"{worst['half_mib']:.1f} MiB)")
        out.append(_check(target, measured, worst["ratio"] <= MEMORY_RATIO_TARGET))
    return out


def training_checks(train: list[dict]) -> list[dict]:
    """The p4 training step reaches ``FLOP_FRACTION_TARGET`` of fp32 matmul FLOP/s (each fp32
    head)."""
    sel = [r for r in train if r["spec"] == "p4" and r["head"] not in BF16_HEADS]
    if not sel:
        return [_check(f"p4 training step ≥ {FLOP_FRACTION_TARGET:.0%} of matmul FLOP/s",
                       "not run", None)]
    return [_check(f"p4 training step ({r['head']} head) ≥ {FLOP_FRACTION_TARGET:.0%} of matmul "
                   "FLOP/s",
                   f"{r['frac_peak']:.0%} ({r['gflops']:.1f} GFLOP/s, "
                   f"{r['tokens_per_s']:,.0f} tokens/s)", r["frac_peak"] >= FLOP_FRACTION_TARGET)
            for r in sel]


def delta_checks(rows: list[dict]) -> list[dict]:
    """The chunked delta layer (additive rule's feature maps, ``delta_*``) at n = 4096 reaches
    ``DELTA_FRACTION_TARGET`` of matmul FLOP/s, forward and forward+backward."""
    out = []
    for pass_ in PASSES:
        sel = [r for r in rows if r.get("rule") == "delta" and r["n"] == 4096
               and r["pass"] == pass_ and r["status"] == "ok"]
        target = (f"chunked delta layer at n = 4096, {PASS_NAMES[pass_]}: ≥ "
                  f"{DELTA_FRACTION_TARGET:.0%} of matmul FLOP/s")
        if not sel:
            out.append(_check(target, "not run (no delta method at n = 4096)", None))
            continue
        worst = min(sel, key=lambda r: r["frac_peak"])
        out.append(_check(target, f"{worst['frac_peak']:.0%} ({worst['method']}, "
                                  f"{worst['gflops']:.1f} GFLOP/s)",
                          worst["frac_peak"] >= DELTA_FRACTION_TARGET))
    return out


def bf16_checks(result: dict) -> list[dict]:
    """With bf16 twins: the LLoPS layer at n = 4096 reaches ``FLOP_FRACTION_TARGET`` (forward)
    and ``BF16_LAYER_FRACTION_TARGET`` (forward+backward) of the bf16 matmul reference (with
    additive state: the gated and delta rules keep their state in fp32 under autocast on a CPU,
    so their share of a bf16 reference says nothing of the bf16 kernels), and the
    bf16 training step at each size of ``BF16_STEP_SPEEDUP_TARGETS`` runs that many times the
    fp32 tokens/s."""
    if not result.get("matmul_bf16"):
        return []
    out = []
    for pass_, goal in (("fwd", FLOP_FRACTION_TARGET), ("fwd_bwd", BF16_LAYER_FRACTION_TARGET)):
        sel = [r for r in result["rows"] if r.get("bf16") and r["family"] == "llops"
               and r.get("rule", "linear") == "linear"  # the gated and delta forms' state
               and r["n"] == 4096 and r["pass"] == pass_ and r["status"] == "ok"]  # runs fp32
        target = (f"LLoPS layer {PASS_NAMES[pass_]} at n = 4096 in bf16: ≥ {goal:.0%} of bf16 "
                  "matmul FLOP/s")
        if not sel:
            out.append(_check(target, "not run (no LLoPS bf16 twin at n = 4096)", None))
            continue
        worst = min(sel, key=lambda r: r["frac_peak"])
        measured = (f"min {worst['frac_peak']:.0%} ({worst['method']}, "
                    f"{worst['gflops']:.1f} GFLOP/s)")
        if result.get("native_bf16"):
            out.append(_check(target, measured, worst["frac_peak"] >= goal))
        else:  # a share of an emulated reference says nothing about the kernels
            out.append(_check(target, f"{measured}; no native bf16, the reference is emulated",
                              None))
    for size, goal in BF16_STEP_SPEEDUP_TARGETS.items():
        steps = {r["head"]: r for r in result["train"] if r["spec"] == size}
        for head, (what, _) in BF16_HEADS.items():
            target = f"training step at the {size} size in {what}: ≥ {goal}× the fp32 tokens/s"
            if head in steps and "answer" in steps:
                ratio = steps[head]["tokens_per_s"] / steps["answer"]["tokens_per_s"]
                out.append(_check(target, f"{ratio:.2f}× ({steps[head]['tokens_per_s']:,.0f} "
                                          f"vs {steps['answer']['tokens_per_s']:,.0f} tokens/s)",
                                  ratio >= goal))
            else:
                out.append(_check(target, "not run", None))
    return out


def _span(ns: tuple[int, int]) -> str:
    """``(1000, 10000)`` → ``"1k–10k"``."""
    return "–".join(f"{n // 1000}k" if n % 1000 == 0 else str(n) for n in ns)


def summary_lines(result: dict) -> list[str]:
    """One ``[PASS] target: measured`` line per check."""
    return [f"[{c['verdict']}] {c['target']}: {c['measured']}" for c in result["targets"]["checks"]]


def target_checks(result: dict) -> dict:
    """All checks and the tables behind them, from one run's ``result`` (eager fp32 layers; the
    ``_compiled`` and ``_bf16`` twins are compared with them in their own tables)."""
    rows = [r for r in result["rows"] if not r.get("compiled") and not r.get("bf16")]
    additive = [r for r in rows if r.get("rule", "linear") in ("linear", "softmax")]
    based = based_ratios(additive)
    soft = softmax_comparison(rows)
    mem = memory_ratios(rows)
    checks = (flop_fraction_checks(additive) + delta_checks(rows) + based_checks(based)
              + softmax_checks(soft) + memory_checks(mem) + training_checks(result["train"])
              + bf16_checks(result))
    return {"checks": checks, "based": based, "softmax": soft, "memory": mem}
