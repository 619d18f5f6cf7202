"""The output files (CSV, markdown, JSON, log–log plot) of a benchmark run.

Every number in ``bench.md`` comes from the result dict of the same run; the target checks are
:mod:`arbench.bench.targets`'.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from arbench import tables
from arbench.bench.layers import PASSES
from arbench.bench.targets import PASS_NAMES, crossover_text, index_rows, seq_lens


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
    """Rows as CSV, floats to 6 significant digits (header from the first row; an empty file
    for no rows)."""
    tables.write_csv(path, [{k: (f"{v:.6g}" if isinstance(v, float) else v)
                             for k, v in row.items()} for row in rows])


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


def _grid(rows: list[dict], pass_: str, cell) -> list[str]:
    """Methods × n table of ``cell(row)`` for one pass."""
    ns = seq_lens(rows)
    idx = index_rows(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    body = [[m] + [_cell(cell, idx[(m, n, pass_)]) for n in ns] for m in methods]
    return tables.markdown_table(["method"] + [f"n={n}" for n in ns], body)


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
             *([f"- CUDA attention backend: {meta['fla']} (bf16/fp16 chunked forms; fp32: "
                "arbench's forms; the `backend` column of bench.csv says per row)"]
               if "fla" in meta else []),
             "- CPU allocator: " + ("glibc heap kept, no mmap per large tensor "
                                    "(`arbench.kernels.keep_heap`)" if meta.get("heap_kept")
                                    else "system defaults"),
             f"- fp32 matmul reference ({mm['size']}×{mm['size']}, median of {mm['repeats']}): "
             f"**{mm['median']:.1f} GFLOP/s** (min {mm['min']:.1f}, max {mm['max']:.1f})",
             *_bf16_matmul_line(result),
             *_interleaved_line(result),
             f"- chunk size used: **{chunk['chosen']}**"
             + (f" (smallest forward+backward total of {' + '.join(chunk['methods'])} at "
                f"n={chunk['n']})" if chunk["table"] else " (given)"), ""]
    if chunk["table"]:
        lines += tables.markdown_table(["method", "chunk", "fwd ms", "fwd+bwd ms"],
                        [[r["method"], str(r["chunk"]), f"{r['fwd_ms']:.1f}",
                          f"{r['fwd_bwd_ms']:.1f}"] for r in chunk["table"]]) + [""]
    blocks = result.get("cp_blocks")
    if blocks:
        lines += [f"- CP feature-map rows per block (0 = one block): **{blocks['chosen']}**"
                  + (f" (smallest forward+backward total of {' + '.join(blocks['methods'])} at "
                     f"n={blocks['n']})" if blocks["table"] else " (given)"), ""]
    if blocks and blocks["table"]:
        lines += tables.markdown_table(["method", "rows per block", "fwd ms", "fwd+bwd ms"],
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


def _interleaved_line(result: dict) -> list[str]:
    """The matmul references timed in the layer timings' rounds: the fractions' denominators."""
    refs = result.get("matmul_interleaved")
    if not refs:
        return []
    parts = [f"{name} **{r['median']:.1f} GFLOP/s** (min {r['min']:.1f}, max {r['max']:.1f})"
             for name, r in refs.items()]
    return [f"- the same matmuls timed once in every round of the layer timings, median of "
            f"{next(iter(refs.values()))['samples']}: {'; '.join(parts)}: every fraction of "
            f"the matmul reference below is of these"]


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
    return ["## Target checks", "", *tables.markdown_table(["target", "measured", "verdict"], body),
            ""]


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
    idx = index_rows(rows)
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
    lines, ns = list(intro), seq_lens(result["rows"])
    for pass_ in PASSES:
        sel = [s for s in speedups if s["pass"] == pass_]
        methods = list(dict.fromkeys(s["method"] for s in sel))
        by = {(s["method"], s["n"]): s for s in sel}
        body = [[m] + [cell(by[(m, n)]) if (m, n) in by else "–" for n in ns] for m in methods]
        lines += [f"### {PASS_NAMES[pass_]}", ""]
        lines += tables.markdown_table(["method"] + [f"n={n}" for n in ns], body) + [""]
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
    ns = seq_lens(result["rows"])
    lines = ["## LLoPS / BASED, forward", "",
             "time ratio < 1: LLoPS faster; compare with the FLOP ratio.", ""]
    lines += tables.markdown_table(["method", "n", "time ratio", "FLOP ratio"],
                    [[r["method"], str(r["n"]), f"{r['time_ratio']:.2f}", f"{r['flop_ratio']:.2f}"]
                     for r in t["based"]]) + [""]
    lines += ["## Linear vs softmax, forward", ""]
    lines += tables.markdown_table(["method", "speedup at largest n", "crossover n"],
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
        lines += tables.markdown_table(["method", "pass", "ratio"],
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
            + tables.markdown_table(header, body) + [""])


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
