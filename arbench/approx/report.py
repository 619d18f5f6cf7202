"""The study's outputs: ``table.md`` (paper layout), ``table.csv`` and ``error_vs_rank.png``."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from arbench import tables
from arbench.approx.records import EXPLICIT, FITTED_OPTIMAL, FLOOR, Record

# SPEC §4: RMAE on layers 0 / 8 / 15 of the paper's softmax Transformer, and the mean.
PAPER_RMAE: dict[tuple[int, str], tuple[float, float, float, float]] = {
    (2, "PolySketchFormer"): (0.186, 0.247, 0.445, 0.293),
    (2, "2-layer MLP"): (0.035, 0.070, 0.058, 0.054),
    (2, "LLoPS t=1"): (0.008, 0.032, 0.025, 0.022),
    (3, "PolySketchFormer"): (0.740, 0.738, 0.745, 0.741),
    (3, "2-layer MLP"): (0.059, 0.114, 0.143, 0.105),
    (3, "LLoPS t=1"): (0.018, 0.040, 0.058, 0.038),
}
METRICS = {"rmae": "RMAE = Σ|Â − A| / Σ|A|",
           "rel_frobenius": "relative Frobenius error ‖Â − A‖_F / ‖A‖_F"}


def columns(records: list[Record]) -> list[tuple[int, int]]:
    """The ``(layer, head)`` columns in run order."""
    return list(dict.fromkeys((r.layer, r.head) for r in records))


def column_label(layer: int, head: int, many_heads: bool) -> str:
    return f"L{layer} h{head}" if many_heads else f"L{layer}"


def row_order(records: list[Record]) -> list[tuple[int, str]]:
    """``(p, method)`` rows: by p, floor rows first, then the methods in run order."""
    keys = list(dict.fromkeys((r.p, r.method) for r in records))
    first = {FLOOR: 0, EXPLICIT: 1, FITTED_OPTIMAL: 2}
    return sorted(keys, key=lambda k: (k[0], first.get(k[1], 3), keys.index(k)))


def mean_value(values: list[float | None]) -> float | None:
    """Mean over the columns, ``None`` unless every column has a value."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]


def _fmt(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}"


def markdown_table(records: list[Record], metric: str) -> str:
    """One markdown table of ``metric`` (``rmae`` or ``rel_frobenius``): rows method × p."""
    cols = columns(records)
    many_heads = len({h for _, h in cols}) > 1
    labels = [column_label(layer, head, many_heads) for layer, head in cols]
    lookup = {(r.p, r.method, r.layer, r.head): r for r in records}
    paper = metric == "rmae"
    head = ["p", "method", "m'", *labels, "mean", "÷ data limit"]
    if paper:
        head += ["paper mean", "paper L0 / L8 / L15"]
    lines = tables.markdown_table(head)
    for p, method in row_order(records):
        found = [lookup.get((p, method, layer, h)) for layer, h in cols]
        values = [getattr(r, metric) if r else None for r in found]
        limit = mean_value([getattr(r, metric) if r else None for r in
                            (lookup.get((p, FITTED_OPTIMAL, layer, h)) for layer, h in cols)])
        mean = mean_value(values)
        dims = sorted({r.feature_dim for r in found if r})
        details = sorted({r.detail for r in found if r and r.detail})
        name = f"{method} ({', '.join(details)})" if details else method
        name = f"**{name}**" if method == FLOOR else name
        ratio = mean / limit if mean is not None and limit else None
        cells = [str(p), name, "/".join(map(str, dims)), *map(_fmt, values), _fmt(mean),
                 "" if method in (FLOOR, EXPLICIT, FITTED_OPTIMAL) or ratio is None
                 else f"{ratio:.2f}×"]
        if paper:
            ref = PAPER_RMAE.get((p, method))
            cells += [_fmt(ref[3]), " / ".join(map(_fmt, ref[:3]))] if ref else ["", ""]
        lines.append(tables.markdown_row(cells))
    return "\n".join(lines)


def machines_line(records: list[Record]) -> str:
    """Where the maps' cells came from (a study resumed on another machine mixes them; each
    cell's in table.csv's ``machine``), and where the floor and data-limit cells were computed
    (every run computes them again); "not recorded" for cells from before records named it."""
    reference = (FLOOR, EXPLICIT, FITTED_OPTIMAL)

    def counted(rows: list[Record]) -> str:
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.machine or "not recorded"] = counts.get(r.machine or "not recorded", 0) + 1
        return ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))

    maps = [r for r in records if r.method not in reference]
    floors = [r for r in records if r.method in reference]
    parts = [f"maps (cells of layer × p × map) computed on: {counted(maps)}"] if maps else []
    if floors:
        parts.append(f"floor and data-limit cells on: {counted(floors)}")
    return "; ".join(parts) + " (each cell's machine: table.csv)"


def write_markdown(records: list[Record], path: Path, notes: list[str]) -> Path:
    """``table.md``: the RMAE table with the paper beside it, then the Frobenius table."""
    parts = ["# Kernel approximation of (q·k)^p: RMAE and the Eckart–Young floor", "",
             *[f"- {n}" for n in [*notes, machines_line(records)]], "",
             f"## {METRICS['rmae']} (held-out pairs; lower is better)", "",
             markdown_table(records, "rmae"), "",
             f"## {METRICS['rel_frobenius']} (held-out pairs)", "",
             "The Eckart–Young row is the floor of this metric for any m-dimensional feature "
             "map: sqrt(Σ_{i>m} σ_i²) / ‖A‖_F of the held-out A = (Q Kᵀ)^p.", "",
             markdown_table(records, "rel_frobenius"), ""]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_csv(records: list[Record], path: Path) -> Path:
    """``table.csv``: one line per (p, method, layer, head) with both metrics."""
    fields = list(asdict(records[0]).keys()) if records else list(Record.__annotations__)
    return tables.write_csv(path, [asdict(r) for r in records], fields)


def plot_error_vs_rank(records: list[Record], path: Path) -> Path:
    """Mean held-out error of LLoPS vs CP rank t, one line per p, the floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(records)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("rel_frobenius", "rmae"), strict=True):
        for i, p in enumerate(sorted({r.p for r in records})):
            color = f"C{i}"
            ranks, errs = [], []
            llops = sorted({r.method for r in records if r.p == p and r.method.startswith("LLoPS")},
                           key=lambda s: int(s.split("=")[1]))
            for method in llops:
                vals = [getattr(r, metric) for r in records if r.p == p and r.method == method]
                if len(vals) == len(cols):
                    ranks.append(int(method.split("=")[1]))
                    errs.append(sum(vals) / len(vals))
            if ranks:
                ax.plot(ranks, errs, "o-", color=color, label=f"LLoPS, p={p}")
            floor = [getattr(r, metric) for r in records if r.p == p and r.method == FLOOR]
            if floor:
                ax.axhline(sum(floor) / len(floor), color=color, ls="--",
                           label=f"Eckart–Young, p={p}" + ("" if metric == "rel_frobenius"
                                                          else " (SVD's RMAE)"))
        ax.set_xscale("log", base=2)
        all_ranks = sorted({int(r.method.split("=")[1]) for r in records
                            if r.method.startswith("LLoPS t=")})
        ax.set_xticks(all_ranks, [str(t) for t in all_ranks])
        ax.minorticks_off()
        ax.set_xlabel("CP rank t")
        ax.set_ylabel(f"mean held-out {'relative Frobenius' if metric != 'rmae' else 'RMAE'}")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("LLoPS error vs CP rank t (mean over layers)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


REPORT_FILES = ("table.md", "table.csv", "error_vs_rank.png")
"""What :func:`write_report` writes into the output folder."""


def remove_report(out_dir: str | Path) -> list[Path]:
    """Delete ``out_dir``'s :data:`REPORT_FILES` (tables no longer of all its records); returns
    those that were there."""
    gone = [Path(out_dir) / name for name in REPORT_FILES if (Path(out_dir) / name).exists()]
    for path in gone:
        path.unlink()
    return gone


def write_report(records: list[Record], out_dir: str | Path,
                 notes: list[str] | None = None) -> dict[str, Path]:
    """Write ``table.md``, ``table.csv`` and ``error_vs_rank.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {"table.md": write_markdown(records, out / "table.md", notes or []),
            "table.csv": write_csv(records, out / "table.csv"),
            "error_vs_rank.png": plot_error_vs_rank(records, out / "error_vs_rank.png")}
