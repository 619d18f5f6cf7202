"""``summary.md`` of a device check (:mod:`arbench.bench.device_check`) from what its steps
wrote: the CUDA tests' counts (``tests.xml``), LLoPS / BASED forward time per n against the
paper's claim and the crossover against softmax, fp32 and bf16 (``bench/*/bench.json``), and
the fits' accuracy (``fit/<name>/version_*/summary.json``). A step that did not run or wrote
nothing is reported as such.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

from arbench.bench.targets import (
    BASED_RANGE,
    based_ratios,
    crossover_text,
    seq_lens,
    softmax_comparison,
)
from arbench.files import atomic_write

DTYPES = {"fp32": False, "bf16": True}  # a dtype's name → the rows' ``bf16`` flag


def junit_counts(path: Path) -> dict[str, int] | None:
    """Tests, failures, errors and skipped of a JUnit XML file (None when absent or torn)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return {key: sum(int(s.get(key, 0)) for s in suites)
            for key in ("tests", "failures", "errors", "skipped")}


def bench_rows(out: Path) -> list[dict]:
    """Every layer row of the bench runs under ``out/bench`` (eager layers only); a (method,
    n, pass) measured by two runs (the fp32 layers of ``fp32/`` and ``bf16/``) is taken from
    the first run in name order."""
    rows: dict[tuple, dict] = {}
    for path in sorted((out / "bench").glob("*/bench.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for r in result["rows"]:
            if not r.get("compiled"):
                rows.setdefault((r["method"], r["n"], r["pass"]), r)
    return list(rows.values())


def rows_of(rows: list[dict], dtype: str) -> list[dict]:
    """The rows of one dtype, the ``_bf16`` twins under their base names, measured ones only."""
    sel = [{**r, "method": r["method"].removesuffix("_bf16")} for r in rows
           if bool(r.get("bf16")) == DTYPES[dtype]]
    return [r for r in sel if r.get("status", "ok") == "ok" and not math.isnan(r["median_ms"])]


def _complete(rows: list[dict]) -> list[dict]:
    """Only methods measured at every n and both passes of these rows (the comparisons index
    every (method, n, pass))."""
    ns = set(seq_lens(rows))
    keep = {m for m in {r["method"] for r in rows}
            if len({(r["n"], r["pass"]) for r in rows if r["method"] == m}) == 2 * len(ns)}
    return [r for r in rows if r["method"] in keep]


def claim_lines(rows: list[dict]) -> list[str]:
    """LLoPS (t = 1) / BASED forward time per n, per dtype, against the claim (LLoPS faster
    over ``BASED_RANGE``), with the backend that computed each."""
    lines = [f"## LLoPS / BASED forward time (the paper: LLoPS faster at "
             f"{BASED_RANGE[0]}–{BASED_RANGE[1]} tokens)", ""]
    for dtype in DTYPES:
        sel = _complete([r for r in rows_of(rows, dtype) if r.get("rule", "linear") in
                         ("linear", "softmax")])
        ratios = based_ratios(sel)
        if not ratios:
            lines += [f"- {dtype}: not measured", ""]
            continue
        ns = sorted({r["n"] for r in ratios})
        backends = {r["method"]: r.get("backend", "?") for r in sel}
        based = ratios[0]["based"]
        lines += [f"{dtype} (time ratio to {based}, attention by {backends.get(based, '?')}; "
                  "< 1: LLoPS faster; FLOP ratio in brackets):", "",
                  "| method | backend | " + " | ".join(f"n={n}" for n in ns) + " | claim |",
                  "|---|---|" + "---|" * (len(ns) + 1)]
        for method in dict.fromkeys(r["method"] for r in ratios):
            mine = {r["n"]: r for r in ratios if r["method"] == method}
            inside = [mine[n]["time_ratio"] < 1 for n in ns if BASED_RANGE[0] <= n <= BASED_RANGE[1]]
            verdict = "n/a" if not inside else ("holds" if all(inside) else "does not hold")
            cells = [f"{mine[n]['time_ratio']:.2f} ({mine[n]['flop_ratio']:.1f})" for n in ns]
            lines.append(f"| {method} | {backends.get(method, '?')} | " + " | ".join(cells)
                         + f" | {verdict} |")
        lines.append("")
    return lines


def crossover_lines(rows: list[dict]) -> list[str]:
    """Per dtype and linear method: the crossover n against softmax (forward) and the speedup
    at the largest n."""
    lines = ["## Crossover against softmax (forward)", ""]
    for dtype in DTYPES:
        sel = _complete(rows_of(rows, dtype))
        comparison = softmax_comparison(sel)
        if not comparison:
            lines += [f"- {dtype}: not measured", ""]
            continue
        ns = seq_lens(sel)
        lines += [f"{dtype}:", "", "| method | linear faster from n | softmax / linear time at "
                  f"n={ns[-1]} |", "|---|---|---|"]
        lines += [f"| {r['method']} | {crossover_text(r, ns)} | {r['speedup']:.2f}× |"
                  for r in comparison]
        lines.append("")
    return lines


def fit_results(fit_dir: Path) -> list[dict]:
    """The newest ``summary.json`` of each run under ``fit_dir``."""
    out = []
    for run in sorted(p for p in fit_dir.glob("*") if p.is_dir()):
        found = sorted(run.glob("version_*/summary.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            continue
        try:
            data = json.loads(found[-1].read_text())
        except (OSError, json.JSONDecodeError):
            continue
        out.append({"run": run.name, **{k: data.get(k) for k in
                                        ("val_acc", "last_val_acc", "global_step",
                                         "wall_time_s", "finished", "device")}})
    return out


def _tests_line(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "not run"
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (f"{counts['tests']} tests: {passed} passed, {counts['failures']} failed, "
            f"{counts['errors']} errors, {counts['skipped']} skipped (`tests.log` names them)")


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def summary_markdown(out: Path, record: dict) -> str:
    """The whole ``summary.md`` (module docstring)."""
    lines = [f"# Device check: {record.get('device', '?')}", "",
             f"- commit `{record.get('commit', '?')}`" + (" (uncommitted changes)"
                                                           if record.get("dirty") else ""),
             f"- torch {record.get('torch')}, CUDA {record.get('cuda')}, {record.get('fla')}",
             f"- started {record.get('started')}, finished {record.get('finished', '–')}, "
             f"budget {record.get('budget_s')} s", ""]
    if record.get("dry_run"):
        lines += ["**Dry run**: nothing was measured; the steps below were checked, not run.", ""]
    lines += ["## Steps", "", "| step | status | wall s | limit s | output |", "|---|---|---|---|---|"]
    for step in record.get("steps", []):
        logs = ", ".join(f"`{c['log']}`" for c in step.get("would_run", step["commands"]))
        lines.append(f"| {step['name']} | {step['status']} | {step['wall_s']} | "
                     f"{step['limit_s']} | {logs} |")
    lines.append("")
    lines += ["## CUDA tests", "", _tests_line(junit_counts(out / "tests.xml")), ""]
    rows = bench_rows(out)
    lines += claim_lines(rows) + crossover_lines(rows)
    fits = fit_results(out / "fit")
    lines += ["## Paper-profile fits (lr 1e-3, bf16-mixed, time-limited: not converged runs)", ""]
    if fits:
        lines += ["| run | best val/acc | last val/acc | steps | wall s | finished |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {f['run']} | {_num(f['val_acc'], '.4f')} | {_num(f['last_val_acc'], '.4f')} | "
                  f"{f['global_step']} | {_num(f['wall_time_s'], '.0f')} | {f['finished']} |"
                  for f in fits]
    else:
        lines.append("no run summary written")
    lines += ["", "Full tables, peak memory included: `bench/<run>/bench.md`."]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, record: dict) -> Path:
    """Write ``out/summary.md`` whole (:func:`arbench.files.atomic_write`)."""
    text = summary_markdown(out, record)
    return atomic_write(out / "summary.md", lambda tmp: tmp.write_text(text))


__all__ = ["bench_rows", "claim_lines", "crossover_lines", "fit_results", "junit_counts",
           "summary_markdown", "write_summary"]
