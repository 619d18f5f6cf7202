"""Target checks and the output files (CSV, markdown, JSON, log–log plot) of a benchmark run.

Every number in ``bench.md`` comes from the result dict of the same run.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from arbench.bench.layers import PASSES

FLOP_FRACTION_TARGET = 0.60
SOFTMAX_SPEEDUP_TARGET = 3.0
MEMORY_RATIO_TARGET = 2.2
BF16_STEP_SPEEDUP_TARGET = 1.6  # bf16 training step tokens/s over fp32's, the cpu size
DELTA_FRACTION_TARGET = 0.40  # the chunked delta layer at n = 4096 (small triangular solves)
BASED_RANGE = (1000, 10000)  # the SPEC's throughput claim covers 1k–10k tokens
PASS_NAMES = {"fwd": "forward", "fwd_bwd": "forward+backward"}


def _index(rows: list[dict]) -> dict[tuple[str, int, str], dict]:
    return {(r["method"], r["n"], r["pass"]): r for r in rows}


def _linear_methods(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in rows if r["family"] != "softmax"))


def _ns(rows: list[dict]) -> list[int]:
    return sorted({r["n"] for r in rows})


def _check(target: str, measured: str, ok: bool | None) -> dict:
    verdict = "n/a" if ok is None else ("PASS" if ok else "MISS")
    return {"target": target, "measured": measured, "verdict": verdict}


def flop_fraction_checks(rows: list[dict]) -> list[dict]:
    """Every linear layer at n ≥ 4096 reaches ``FLOP_FRACTION_TARGET`` of matmul FLOP/s."""
    out = []
    for pass_ in PASSES:
        sel = [r for r in rows if r["family"] != "softmax" and r["n"] >= 4096 and r["pass"] == pass_]
        target = f"linear layers, n ≥ 4096, {PASS_NAMES[pass_]}: ≥ 60% of matmul FLOP/s"
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
    idx, out = _index(rows), []
    based = next((r["method"] for r in rows if r["family"] == "based"), None)
    llops = [m for m in _linear_methods(rows) if m.startswith("llops") and m.endswith("_t1")]
    for method in llops if based else []:
        for n in _ns(rows):
            a, b = idx[(method, n, "fwd")], idx[(based, n, "fwd")]
            out.append({"method": method, "based": based, "n": n,
                        "time_ratio": a["median_ms"] / b["median_ms"],
                        "flop_ratio": a["gflop"] / b["gflop"]})
    return out


def based_checks(ratios: list[dict]) -> list[dict]:
    """SPEC claim: LLoPS forward faster than BASED at 1k–10k tokens (time ratio < 1)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in ratios):
        sel = [r for r in ratios if r["method"] == method and
               BASED_RANGE[0] <= r["n"] <= BASED_RANGE[1]]
        target = f"{method} forward faster than {ratios[0]['based']} at 1k–10k (time ratio < 1)"
        if not sel:
            out.append(_check(target, "no n in 1k–10k in this run", None))
            continue
        measured = "; ".join(f"n={r['n']}: {r['time_ratio']:.2f}× time, {r['flop_ratio']:.1f}× FLOPs"
                             for r in sel)
        out.append(_check(target, measured, all(r["time_ratio"] < 1 for r in sel)))
    return out


def softmax_comparison(rows: list[dict]) -> list[dict]:
    """Per linear method: forward speedup over softmax at the largest n, and the crossover n
    (smallest grid n from which on the linear layer's forward is faster)."""
    idx, ns = _index(rows), _ns(rows)
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
    """Chunked linear attention ≥ 3× faster than softmax (forward) at the largest n."""
    if not comparison:
        return [_check("linear vs softmax forward at the largest n: ≥ 3×", "softmax not run", None)]
    n = comparison[0]["n"]
    worst = min(comparison, key=lambda r: r["speedup"])
    best = max(comparison, key=lambda r: r["speedup"])
    measured = (f"min {worst['speedup']:.2f}× ({worst['method']}), "
                f"max {best['speedup']:.2f}× ({best['method']})")
    return [_check(f"every linear layer vs softmax, forward at n={n}: ≥ 3× faster", measured,
                   worst["speedup"] >= SOFTMAX_SPEEDUP_TARGET)]


def memory_ratios(rows: list[dict]) -> list[dict]:
    """Peak memory at the largest n over the peak at half of it, per linear method and pass."""
    idx, ns = _index(rows), _ns(rows)
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
    """Chunked peak memory at the largest n ≤ 2.2 × the peak at half of it."""
    if not ratios or all(math.isnan(r["ratio"]) for r in ratios):
        return [_check("chunked peak memory at n_max ≤ 2.2 × at n_max/2",
                       "not measured (needs memory and both n)", None)]
    out = []
    for pass_ in PASSES:
        sel = [r for r in ratios if r["pass"] == pass_]
        worst = max(sel, key=lambda r: r["ratio"])
        target = (f"chunked peak memory, {PASS_NAMES[pass_]}: n={worst['n']} ≤ 2.2 × "
                  f"n={worst['half']}")
        measured = (f"max {worst['ratio']:.2f}× ({worst['method']}: {worst['peak_mib']:.1f} vs "
                    f"{worst['half_mib']:.1f} MiB)")
        out.append(_check(target, measured, worst["ratio"] <= MEMORY_RATIO_TARGET))
    return out


def training_checks(train: list[dict]) -> list[dict]:
    """The p4 training step reaches ≥ 60% of fp32 matmul FLOP/s (each fp32 head)."""
    sel = [r for r in train if r["spec"] == "p4" and not r["head"].endswith("_bf16")]
    if not sel:
        return [_check("p4 training step ≥ 60% of matmul FLOP/s", "not run", None)]
    return [_check(f"p4 training step ({r['head']} head) ≥ 60% of matmul FLOP/s",
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
        target = f"chunked delta layer at n = 4096, {PASS_NAMES[pass_]}: ≥ 40% of matmul FLOP/s"
        if not sel:
            out.append(_check(target, "not run (no delta method at n = 4096)", None))
            continue
        worst = min(sel, key=lambda r: r["frac_peak"])
        out.append(_check(target, f"{worst['frac_peak']:.0%} ({worst['method']}, "
                                  f"{worst['gflops']:.1f} GFLOP/s)",
                          worst["frac_peak"] >= DELTA_FRACTION_TARGET))
    return out


def bf16_checks(result: dict) -> list[dict]:
    """With bf16 twins: the LLoPS forward at n = 4096 reaches ≥ 60% of the bf16 matmul
    reference, and the bf16 training step at the ``cpu`` size runs ≥ 1.6× the fp32 tokens/s."""
    if not result.get("matmul_bf16"):
        return []
    out = []
    sel = [r for r in result["rows"] if r.get("bf16") and r["family"] == "llops"
           and r["n"] == 4096 and r["pass"] == "fwd" and r["status"] == "ok"]
    target = "LLoPS layer forward at n = 4096 in bf16: ≥ 60% of bf16 matmul FLOP/s"
    if sel:
        worst = min(sel, key=lambda r: r["frac_peak"])
        measured = f"min {worst['frac_peak']:.0%} ({worst['method']}, {worst['gflops']:.1f} GFLOP/s)"
        if result.get("native_bf16"):
            out.append(_check(target, measured, worst["frac_peak"] >= FLOP_FRACTION_TARGET))
        else:  # a share of an emulated reference says nothing about the kernels
            out.append(_check(target, f"{measured}; no native bf16, the reference is emulated",
                              None))
    else:
        out.append(_check(target, "not run (no LLoPS bf16 twin at n = 4096)", None))
    steps = {r["head"]: r for r in result["train"] if r["spec"] == "cpu"}
    target = (f"training step at the cpu size in bf16: ≥ {BF16_STEP_SPEEDUP_TARGET}× the fp32 "
              "tokens/s")
    if "answer_bf16" in steps and "answer" in steps:
        ratio = steps["answer_bf16"]["tokens_per_s"] / steps["answer"]["tokens_per_s"]
        out.append(_check(target, f"{ratio:.2f}× ({steps['answer_bf16']['tokens_per_s']:,.0f} "
                                  f"vs {steps['answer']['tokens_per_s']:,.0f} tokens/s)",
                          ratio >= BF16_STEP_SPEEDUP_TARGET))
    else:
        out.append(_check(target, "not run", None))
    return out


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


def write_outputs(result: dict, out_dir: Path) -> None:
    """``bench.csv``, ``train.csv``, ``bench.json``, ``bench.md``, ``bench.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(result["rows"], out_dir / "bench.csv")
    write_csv(result["train"], out_dir / "train.csv")
    (out_dir / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    (out_dir / "bench.md").write_text(markdown(result))
    plot([r for r in result["rows"] if not r.get("compiled") and not r.get("bf16")],
         out_dir / "bench.png")


def write_csv(rows: list[dict], path: Path) -> None:
    """Rows as CSV (header from the first row; an empty file for no rows)."""
    with open(path, "w", newline="") as fh:
        if not rows:
            return
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def plot(rows: list[dict], path: Path) -> None:
    """Log–log median time vs n (min–max bars), forward and forward+backward side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharex=True)
    for ax, pass_ in zip(axes, PASSES):
        for method in dict.fromkeys(r["method"] for r in rows):
            sel = sorted((r for r in rows if r["method"] == method and r["pass"] == pass_
                          and r.get("status", "ok") == "ok"), key=lambda r: r["n"])
            if not sel:
                continue
            ns = [r["n"] for r in sel]
            med = [r["median_ms"] for r in sel]
            err = [[m - r["min_ms"] for m, r in zip(med, sel)],
                   [r["max_ms"] - m for m, r in zip(med, sel)]]
            style = "k--" if method == "softmax" else "-"
            ax.errorbar(ns, med, yerr=err, fmt=style, marker="o", ms=3, capsize=2, label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n (tokens)")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"one attention layer, {PASS_NAMES[pass_]}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def _grid(rows: list[dict], pass_: str, cell) -> list[str]:
    """Methods × n table of ``cell(row)`` for one pass."""
    ns = _ns(rows)
    idx = _index(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    body = [[m] + [_cell(cell, idx[(m, n, pass_)]) for n in ns] for m in methods]
    return _table(["method"] + [f"n={n}" for n in ns], body)


def _cell(cell, row: dict) -> str:
    return cell(row) if row.get("status", "ok") == "ok" else "skipped"


def _mib(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.1f}"


def markdown(result: dict) -> str:
    """The human-readable report of one run."""
    out = _header_section(result) + _targets_section(result) + _timing_section(result)
    out += _comparison_section(result) + _compile_section(result) + _bf16_section(result)
    out += _memory_section(result)
    out += _training_section(result)
    out += _notes_section(result)
    return "\n".join(out) + "\n"


def _header_section(result: dict) -> list[str]:
    meta, cfg, mm, chunk = result["meta"], result["config"], result["matmul"], result["chunk"]
    lines = ["# Attention layer benchmark", "",
             f"- command: `{meta.get('command') or 'run_benchmark(...)'}`",
             f"- machine: {meta['cpu']}, device `{meta['device']}`"
             + (f" ({meta['gpu']})" if "gpu" in meta else "")
             + f", {meta['threads']} threads, torch {meta['torch']}",
             f"- wall time: {meta.get('wall_s', float('nan')):.0f} s; repeats: {cfg['repeats']} "
             f"(interleaved rounds); batch {cfg['batch']}, heads {cfg['heads']}, head dim "
             f"{cfg['head_dim']}, m {cfg['m']}, normalize `{cfg['normalize']}`",
             _load_line(meta),
             "- CPU allocator: " + ("glibc heap kept, no mmap per large tensor "
                                    "(`arbench.kernels.keep_heap`)" if meta.get("heap_kept")
                                    else "system defaults"),
             f"- fp32 matmul reference ({mm['size']}×{mm['size']}, median of {mm['repeats']}): "
             f"**{mm['median']:.1f} GFLOP/s** (min {mm['min']:.1f}, max {mm['max']:.1f})",
             *_bf16_matmul_line(result),
             f"- chunk size used: **{chunk['chosen']}**"
             + (f" (smallest forward+backward total of {' + '.join(chunk['methods'])} at "
                f"n={chunk['n']})" if chunk["table"] else " (given)"), ""]
    if chunk["table"]:
        lines += _table(["method", "chunk", "fwd ms", "fwd+bwd ms"],
                        [[r["method"], str(r["chunk"]), f"{r['fwd_ms']:.1f}",
                          f"{r['fwd_bwd_ms']:.1f}"] for r in chunk["table"]]) + [""]
    blocks = result.get("cp_blocks")
    if blocks:
        lines += [f"- CP feature-map rows per block (0 = one block): **{blocks['chosen']}**"
                  + (f" (smallest forward+backward total of {' + '.join(blocks['methods'])} at "
                     f"n={blocks['n']})" if blocks["table"] else " (given)"), ""]
    if blocks and blocks["table"]:
        lines += _table(["method", "rows per block", "fwd ms", "fwd+bwd ms"],
                        [[r["method"], str(r["rows"]), f"{r['fwd_ms']:.1f}",
                          f"{r['fwd_bwd_ms']:.1f}"] for r in blocks["table"]]) + [""]
    if result["forms"]:
        worst = max(result["forms"], key=lambda r: r["rel_err"])
        lines += [f"Chunked vs quadratic form (n={worst['n']}, chunk {worst['chunk']}, every linear "
                  f"method, numerator and denominator): max relative difference "
                  f"{worst['rel_err']:.1e} ({worst['method']}).", ""]
    if result.get("compiled_check"):
        worst = max(result["compiled_check"], key=lambda r: r["rel_err"])
        lines += [f"torch.compile vs eager (forward, n={worst['n']}, every compiled method): max "
                  f"relative difference {worst['rel_err']:.1e} ({worst['method']}).", ""]
    if result.get("bf16_check"):
        worst = max(result["bf16_check"], key=lambda r: r["rel_err"])
        lines += [f"bf16 autocast vs fp32 (forward, n={worst['n']}, every bf16 method): max "
                  f"relative difference {worst['rel_err']:.1e} ({worst['method']}).", ""]
    return lines


def _bf16_matmul_line(result: dict) -> list[str]:
    """The bf16 matmul reference and whether the hardware has native bf16 (none without it)."""
    mm = result.get("matmul_bf16")
    if not mm:
        return []
    native = "native bf16" if result.get("native_bf16") else \
        "**no native bf16 on this device: emulated**"
    return [f"- bf16 matmul reference ({mm['size']}×{mm['size']}, median of {mm['repeats']}): "
            f"**{mm['median']:.1f} GFLOP/s** (min {mm['min']:.1f}, max {mm['max']:.1f}; "
            f"{mm['median'] / result['matmul']['median']:.2g}× fp32; {native})"]


def _load_line(meta: dict) -> str:
    """Load averages around the run, with a warning when other work was running at its start."""
    start, end = meta.get("loadavg_start"), meta.get("loadavg_end")
    if not start or not end:
        return "- machine load: unknown"
    line = (f"- machine load (1/5/15-min load average): at start {start[0]:.1f}/{start[1]:.1f}/"
            f"{start[2]:.1f}, at end {end[0]:.1f}/{end[1]:.1f}/{end[2]:.1f}")
    if start[0] > 0.5:
        line += (" — **other processes were using the CPU: times are inflated and noisy, "
                 "small cases most**")
    return line


def _targets_section(result: dict) -> list[str]:
    body = [[c["target"], c["measured"], f"**{c['verdict']}**"] for c in result["targets"]["checks"]]
    return ["## Target checks", ""] + _table(["target", "measured", "verdict"], body) + [""]


def _timing_section(result: dict) -> list[str]:
    rows, lines = result["rows"], ["## Layer time per call, ms: median (min–max)", ""]
    for pass_ in PASSES:
        lines += [f"### {PASS_NAMES[pass_]}", ""]
        lines += _grid(rows, pass_, lambda r: f"{r['median_ms']:.2f} ({r['min_ms']:.2f}–"
                                              f"{r['max_ms']:.2f})") + [""]
    lines += ["## Achieved FLOP/s as a fraction of the matmul reference", ""]
    for pass_ in PASSES:
        lines += [f"### {PASS_NAMES[pass_]}", ""]
        lines += _grid(rows, pass_, lambda r: f"{r['frac_peak']:.0%} ({r['gflops']:.0f})") + [""]
    return lines


def twin_speedups(rows: list[dict], flag: str) -> list[dict]:
    """Base / twin median time of every twin row (``flag``: ``"compiled"`` or ``"bf16"``; the
    twin is ``<name>_<flag>``), with the twin's share of its matmul reference (> 1: the twin
    pays)."""
    idx = _index(rows)
    out = []
    for r in rows:
        base = idx.get((r["method"].removesuffix(f"_{flag}"), r["n"], r["pass"]))
        if r.get(flag) and base and r["status"] == "ok":
            out.append({"method": base["method"], "n": r["n"], "pass": r["pass"],
                        "speedup": base["median_ms"] / r["median_ms"],
                        "frac_peak": r["frac_peak"]})
    return out


def _twin_section(result: dict, flag: str, intro: list[str], cell) -> list[str]:
    """Methods × n tables of ``cell(speedup row)`` per pass for the ``flag`` twins."""
    speedups = twin_speedups(result["rows"], flag)
    if not speedups:
        return []
    lines, ns = list(intro), _ns(result["rows"])
    for pass_ in PASSES:
        sel = [s for s in speedups if s["pass"] == pass_]
        methods = list(dict.fromkeys(s["method"] for s in sel))
        by = {(s["method"], s["n"]): s for s in sel}
        body = [[m] + [cell(by[(m, n)]) if (m, n) in by else "–" for n in ns] for m in methods]
        lines += [f"### {PASS_NAMES[pass_]}", ""]
        lines += _table(["method"] + [f"n={n}" for n in ns], body) + [""]
    return lines


def _compile_section(result: dict) -> list[str]:
    intro = ["## torch.compile: eager time / compiled time (> 1: compiling pays)", "",
             "Compiled once per shape (`dynamic=False`) during warm-up; the compile time is not "
             "in these medians.", ""]
    return _twin_section(result, "compiled", intro, lambda s: f"{s['speedup']:.2f}×")


def _bf16_section(result: dict) -> list[str]:
    intro = ["## bf16 autocast: fp32 time / bf16 time (share of the bf16 matmul reference)", "",
             "The same layers and weights under `torch.autocast(dtype=bfloat16)`; > 1: bf16 "
             "pays.", ""]
    return _twin_section(result, "bf16", intro,
                         lambda s: f"{s['speedup']:.2f}× ({s['frac_peak']:.0%})")


def _comparison_section(result: dict) -> list[str]:
    t = result["targets"]
    ns = _ns(result["rows"])
    lines = ["## LLoPS / BASED, forward", "",
             "time ratio < 1: LLoPS faster; compare with the FLOP ratio.", ""]
    lines += _table(["method", "n", "time ratio", "FLOP ratio"],
                    [[r["method"], str(r["n"]), f"{r['time_ratio']:.2f}", f"{r['flop_ratio']:.2f}"]
                     for r in t["based"]]) + [""]
    lines += ["## Linear vs softmax, forward", ""]
    lines += _table(["method", "speedup at largest n", "crossover n"],
                    [[r["method"], f"{r['speedup']:.2f}× (n={r['n']})", crossover_text(r, ns)]
                     for r in t["softmax"]]) + [""]
    return lines


def _memory_section(result: dict) -> list[str]:
    rows, mem = result["rows"], result["memory"]
    lines = ["## Peak memory over inputs and weights, MiB", "", f"Method: {mem['method']}."]
    if "probe_mib" in mem:
        lines += [f"Probe: a {mem['probe_expected_mib']:.0f} MiB tensor reads as "
                  f"{mem['probe_mib']:.1f} MiB."]
    lines.append("")
    for pass_ in PASSES:
        lines += [f"### {PASS_NAMES[pass_]}", ""] + _grid(rows, pass_, lambda r: _mib(r["peak_mib"]))
        lines.append("")
    if result["targets"]["memory"]:
        lines += _table(["method", "pass", "ratio"],
                        [[r["method"], r["pass"], f"{r['ratio']:.2f} (n={r['n']} / n={r['half']})"]
                         for r in result["targets"]["memory"]]) + [""]
    return lines


def _training_section(result: dict) -> list[str]:
    if not result["train"]:
        return []
    body = [[r["spec"], r["head"], f"{r['vocab']}/{r['d_model']}/{r['m']}/{r['p']}",
             f"{r['batch']}×{r['seq']}, {r['pairs']} pairs",
             f"{r['tokens_per_s']:,.0f} ({r['tokens_per_s_min']:,.0f}–{r['tokens_per_s_max']:,.0f})",
             f"{r['step_ms']:.1f}", f"{r['gflop_per_step']:.2f}", f"{r['frac_peak']:.0%}"]
            for r in result["train"]]
    header = ["size", "head", "vocab/d_model/m/p", "batch", "tokens/s median (min–max)",
              "step ms", "GFLOP/step", "of matmul"]
    return (["## Training step (AdamW), RecallModel conv + LLoPS linear", ""]
            + _table(header, body) + [""])


def _notes_section(result: dict) -> list[str]:
    return ["## How this was measured", "",
            "- Times: each case is warmed up (once, twice when short), then timed in "
            "interleaved rounds (all methods at one n and pass back to back, the order rotated "
            "every round); a sample loops a case until it lasts the configured minimum; "
            "medians with min–max over rounds.",
            "- `fwd` runs under `torch.no_grad`; `fwd_bwd` is forward with gradients for q, k, v "
            "and the feature-map weights, then `backward` of a fixed random output gradient.",
            "- FLOPs are counted from shapes (formulas in `arbench/bench/flops.py`); "
            "forward+backward counts 3× forward; softmax counts only the causal pairs, the "
            "chunked form counts its masked intra-chunk entries too.",
            "- The recurrent form is not benchmarked (a Python loop over tokens). Softmax "
            f"forward+backward runs only up to n = {result['config']['softmax_bwd_max_n']} "
            "(0: no cap); skipped cases keep their CSV row with NaN values and the reason.",
            "- The machine may be shared: compare ratios within one run, not across runs.", ""]
