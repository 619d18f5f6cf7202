"""The spec's plots of a report: accuracy against an hparam, or learning curves.

The spec's plots: accuracy against an hparam (one line per series, or a marker per
method), or learning curves, over the rows of the table; and the suite's heat map of methods
× tasks (:func:`write_heatmap`, :mod:`sweeps.report.suite`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from arbench.curves import STOP_THRESHOLD
from sweeps.report.labels import label, matches_all, variant_name
from sweeps.report.loss import smoothed_loss_curves
from sweeps.spec import TRAIN_LOSS

LOSS_WINDOW = 10
"""Logged training losses per trailing mean in a loss-curve plot (250 steps at the profiles'
``log_every_n_steps`` of 25)."""


def mean_curve(curves: list[list], hold_at: float | None = STOP_THRESHOLD
               ) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps and the mean, min and max of the value over ``curves`` ((step, value) lists) at
    each step some run is present at. A run counts from its first step to its last one only: a
    run pruned or cut short drops out of the mean after its last step (the mean is over the
    runs still present), never holding its last value. The exception is a run that stopped
    early because it reached ``hold_at`` (the early-stopping threshold; None for none, e.g. for
    losses): it holds its last value to the end, as it would have stayed solved."""
    steps = sorted({int(s) for c in curves if c for s, _ in c})
    rows = []
    for c in curves:
        if not c:
            continue
        at = {int(s): a for s, a in c}
        held = hold_at is not None and max(a for _, a in c) >= hold_at
        end = max(at) if not held else steps[-1]
        last, row = None, []
        for s in steps:
            last = at.get(s, last)
            row.append(last if s <= end else None)
        rows.append(row)
    cols = [[r[i] for r in rows if r[i] is not None] for i in range(len(steps))]
    keep = [i for i, col in enumerate(cols) if col]
    return ([steps[i] for i in keep], [statistics.fmean(cols[i]) for i in keep],
            [min(cols[i]) for i in keep], [max(cols[i]) for i in keep])


KEY_NAMES = {"rank": "t", "d_model": "d"}
"""Short names of hparams in plot labels (as :func:`label` writes them)."""


def key_text(hp: dict[str, Any], keys: list[str]) -> str:
    """``hp``'s values of ``keys`` as ``"t=2 d=192"`` (keys it has no value for left out)."""
    return " ".join(f"{KEY_NAMES.get(k, k)}={hp[k]}" for k in keys if hp.get(k) is not None)


RUN_KEYS = frozenset({"seed", "lr", "params", "state_size"})
"""Hparams of a row that are no grid key of it: its first run's seed and lr, and sizes that
follow from the grid's (parameter count, state size)."""


def grid_keys(table: list[dict[str, Any]]) -> set[str]:
    """The hparams the rows' grid points set (``model.d_model`` sets ``d_model``), less
    :data:`RUN_KEYS`; every hparam of theirs where no row has a grid point."""
    named = {k.rsplit(".", 1)[-1] for r in table for k in r.get("point") or {}}
    keys = {k for r in table for k in r["hparams"]}
    return (keys & named if any(r.get("point") for r in table) else keys) - RUN_KEYS


def differing_keys(groups: list[list[dict[str, Any]]], keys: set[str]) -> list[str]:
    """Those of ``keys`` (sorted) whose values differ between the hparams of some one of
    ``groups``: the keys that tell apart rows that would otherwise share a name or a point."""
    return sorted(k for k in keys
                  if any(len({repr(hp.get(k)) for hp in hps}) > 1 for hps in groups))


def write_plot(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """Accuracy (mean ± std) against ``plot['x']``, one line per ``plot['series']`` value (an
    hparam, or ``variant``: the diagnosis switches), over the rows matching ``plot['where']``
    (``{hparam: value or [values]}``, optional); see :func:`line_plot`. ``x: step`` draws
    learning curves instead (:func:`write_curves`); ``marker_by: method`` draws unjoined points
    instead (:func:`write_marked_plot`)."""
    if plot["x"] == "step":
        return write_curves(table, plot, out)
    if plot.get("marker_by") == "method":
        return write_marked_plot(table, plot, out)
    fig, ax = line_plot(table, plot)
    return save_plot(fig, out / f"{plot.get('name', 'acc_vs_' + plot['x'])}.png")


def line_plot(table: list[dict[str, Any]], plot: dict[str, Any]) -> tuple[Any, Any]:
    """The figure and axes of :func:`write_plot`: a line per series value, joining its rows in
    order of x. Where rows of one series share an x (e.g. LLoPS p=4 at t=1, 2 and 4 have one
    state size), the series is split by the hparams that tell those rows apart (a line each,
    labelled e.g. ``"p=4 t=2"``), so that no line joins two methods at one x."""
    import matplotlib  # here: keeps matplotlib out of CLI start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, series_key = plot["x"], plot.get("series", "feature_map")
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in plotted_rows(table, plot):
        hp = r["hparams"]
        if series_key == "feature_map":
            name = str(hp.get("feature_map"))
        elif series_key == "variant":  # the diagnosis switches (report.variant)
            name = variant_name(hp)
        else:
            name = f"{series_key}={hp.get(series_key)}"
        series[name].append(r)
    at_one_x = [[r["hparams"] for r in rs if float(r["hparams"][x_key]) == x]
                for rs in series.values() for x in {float(r["hparams"][x_key]) for r in rs}]
    rows_in = [r for rs in series.values() for r in rs]
    split = differing_keys(at_one_x, grid_keys(rows_in) - {x_key, series_key})
    groups: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for name, rs in series.items():
        for r in rs:
            sub = key_text(r["hparams"], split)
            groups[f"{name} {sub}" if sub else name].append(
                (float(r["hparams"][x_key]), *plotted_value(r, plot)))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, pts in sorted(groups.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    marker="o", capsize=3, label=name)
    if plot.get("xscale") == "log":
        log_x_axis(ax, {x for pts in groups.values() for x, _, _ in pts})
    label_axes(ax, x_key, y_label(plot), plot.get("title", f"accuracy vs {x_key}"))
    return fig, ax


def write_curves(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """The learning curves of :func:`curves_plot`, saved."""
    fig, ax = curves_plot(table, plot)
    name = "loss_curves" if plot.get("y") == TRAIN_LOSS else "learning_curves"
    return save_plot(fig, out / f"{plot.get('name', name)}.png")


def curves_plot(table: list[dict[str, Any]], plot: dict[str, Any]) -> tuple[Any, Any]:
    """Validation accuracy (the study's objective, each row's ``curve_metric``) against
    training step (``x: step``): one line per row (a point at its best lr), the mean over its
    seeds that have a curve (:func:`mean_curve`: a pruned run drops out after its last step)
    with their range shaded; its legend's ``n`` counts those runs. ``y: train_loss``: the
    training loss instead, each run's from its record (or, for a run recorded before records
    kept it, its event files), smoothed over :data:`LOSS_WINDOW` logged values
    (:mod:`sweeps.report.loss`). A row none of whose runs has a curve is left out, and named
    in a note under the plot. Rows that share a label (e.g. at two ``d_model``) have the
    hparams that tell them apart added to it (``d=192``)."""
    import matplotlib  # here: keeps matplotlib out of CLI start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loss = plot.get("y") == TRAIN_LOSS
    scale = 1.0 if loss else 100.0
    where = plot.get("where") or {}
    shown = [r for r in table if matches_all(r["hparams"], where)]
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in shown:
        by_label[label(r["hparams"])].append(r["hparams"])
    extra = differing_keys(list(by_label.values()), grid_keys(shown))
    fig, ax = plt.subplots(figsize=(6, 4))
    missing = []
    for r in shown:
        name = " ".join(filter(None, [label(r["hparams"]), key_text(r["hparams"], extra)]))
        curves = smoothed_loss_curves(r.get("log_dirs", []), LOSS_WINDOW,
                                      r.get("loss_curves")) if loss else r["curves"]
        curves = [c for c in curves or [] if c]
        steps, mean, lo, hi = mean_curve(curves, None if loss else STOP_THRESHOLD)
        if not steps:
            missing.append(name)
            continue
        line, = ax.plot(steps, [scale * v for v in mean], marker="" if loss else ".",
                        label=f"{name} (lr {r['best_lr']:g}, n={len(curves)})")
        ax.fill_between(steps, [scale * v for v in lo], [scale * v for v in hi], alpha=0.15,
                        color=line.get_color())
    metric = next((r["curve_metric"] for r in table if r.get("curve_metric")), "val/acc")
    if loss:
        ax.set_yscale("log")  # the late differences between arms are at losses near 0.05
        y_text = f"training loss, nats (trailing mean of {LOSS_WINDOW} logged)"
        title = "training loss, mean over seeds (range shaded)"
    else:
        y_text = f"{metric} % (mean over seeds; range shaded)"
        title = "learning curves at each point's best lr"
    if missing:
        what = "training loss" if loss else f"{metric} curve"
        fig.text(0.01, 0.005, f"no {what} for: " + "; ".join(missing), fontsize=6,
                 ha="left", va="bottom", wrap=True)
    label_axes(ax, "training step", y_text, plot.get("title", title), legend_size=7)
    return fig, ax


def write_marked_plot(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """Accuracy (mean ± std) against ``plot['x']`` as unjoined points: a colour per
    ``plot['series']`` hparam value and a marker shape per method (:func:`label` without the
    series hparam), so that
    methods sharing an x (LLoPS p=2 and p=4 have one state size) stay apart. Each series is
    nudged sideways by 1.5% of x so that its error bars do not hide another's."""
    import matplotlib  # here: keeps matplotlib out of CLI start-up

    matplotlib.use("Agg")
    import matplotlib.lines
    import matplotlib.pyplot as plt

    x_key, series_key = plot["x"], plot.get("series", "mixers")
    points = [(str(r["hparams"].get(series_key)),
               label({k: v for k, v in r["hparams"].items() if k != series_key}),
               float(r["hparams"][x_key]), *plotted_value(r, plot))
              for r in plotted_rows(table, plot)]
    series = sorted({p[0] for p in points})
    methods = sorted({p[1] for p in points})
    colours = {s: f"C{i}" for i, s in enumerate(series)}
    shapes = {m: "osD^vP*X"[i % 8] for i, m in enumerate(methods)}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for s, m, x, y, e in points:
        nudge = 1 + 0.015 * (series.index(s) - (len(series) - 1) / 2)
        ax.errorbar([x * nudge], [y], yerr=[e], color=colours[s], marker=shapes[m],
                    linestyle="none", capsize=3, label=f"{series_key}={s} · {m}")
    if plot.get("xscale") == "log":
        log_x_axis(ax, {p[2] for p in points}, rotation=30)
    handles = [matplotlib.lines.Line2D([], [], color=colours[s], linestyle="none", marker="o",
                                       label=f"{series_key}={s}") for s in series]
    handles += [matplotlib.lines.Line2D([], [], color="k", linestyle="none", marker=shapes[m],
                                        label=m) for m in methods]
    label_axes(ax, x_key, y_label(plot), plot.get("title", f"accuracy vs {x_key}"),
               handles=handles)
    return save_plot(fig, out / f"{plot.get('name', 'acc_vs_' + x_key)}.png")


def plotted_rows(table: list[dict[str, Any]], plot: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``table`` that have ``plot['x']`` and match ``plot['where']`` (and, with
    ``plot['y']`` a slice, that have that slice; without, a value: a point not yet run at
    every setting has none)."""
    where = plot.get("where") or {}
    y = plot.get("y")
    return [r for r in table if r["hparams"].get(plot["x"]) is not None
            and (y is not None or r.get("n", 1) > 0)
            and matches_all(r["hparams"], where)
            and (y is None or r.get("slice_values", {}).get(y))]


def y_label(plot: dict[str, Any]) -> str:
    """The y axis of a plot: the objective's accuracy, or one slice's."""
    where = f" on {plot['y']}" if plot.get("y") else ""
    return f"accuracy{where} % (mean ± std over seeds)"


def plotted_value(row: dict[str, Any], plot: dict[str, Any]) -> tuple[float, float]:
    """A row's y as (mean, sample std) in percent over its best lr's runs: the objective, or
    with ``plot['y']`` the accuracy on that slice (e.g. ``L1024_N256``)."""
    y = plot.get("y")
    if y is None:
        return 100 * row["mean"], 100 * row["std"]
    values = row["slice_values"][y]
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return 100 * statistics.fmean(values), 100 * std


def log_x_axis(ax: Any, xs: set[float], rotation: int = 0) -> None:
    """A log x axis; up to 8 distinct ``xs`` are labelled by their own values, not by powers
    of ten."""
    import matplotlib.ticker  # here: keeps matplotlib out of CLI start-up

    ax.set_xscale("log")
    xs_sorted = sorted(xs)
    if 0 < len(xs_sorted) <= 8:
        ax.set_xticks(xs_sorted, [f"{x:g}" for x in xs_sorted], rotation=rotation)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def label_axes(ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int = 8,
               handles: list[Any] | None = None) -> None:
    """Label, grid and legend ``ax``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if handles is not None or ax.get_legend_handles_labels()[0]:
        ax.legend(handles=handles, fontsize=legend_size)


def save_plot(fig: Any, path: Path) -> Path:
    """Lay out ``fig``, save it to ``path`` (120 dpi) and close it."""
    import matplotlib.pyplot as plt  # here: keeps matplotlib out of CLI start-up

    fig.tight_layout(rect=(0, 0.08 if fig.texts else 0, 1, 1))  # room for a note under it
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_heatmap(values: list[list[float]], row_labels: list[str], column_labels: list[str],
                  path: Path, colour_label: str, title: str = "") -> Path:
    """A heat map of ``values`` (rows × columns, in percent; NaN where missing, drawn grey
    with "–", never as 0), each cell annotated with its value; the colour scale spans the
    values present. The last column is set off by a line when there are several."""
    import matplotlib  # here: keeps matplotlib out of CLI start-up

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.ma.masked_invalid(np.array(values, dtype=float).reshape(len(row_labels),
                                                                     len(column_labels)))
    present = data.compressed()
    low, high = (float(present.min()), float(present.max())) if present.size else (0.0, 100.0)
    if high - low < 1e-9:
        low, high = low - 1.0, high + 1.0
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    width = 2.0 + 0.07 * max((len(r) for r in row_labels), default=0) + 1.1 * len(column_labels)
    fig, ax = plt.subplots(figsize=(width, 1.5 + 0.38 * len(row_labels)))
    image = ax.imshow(data, cmap=cmap, vmin=low, vmax=high, aspect="auto")
    for i in range(len(row_labels)):
        for j in range(len(column_labels)):
            missing = bool(np.ma.getmaskarray(data)[i, j])
            dark = not missing and data[i, j] < (low + high) / 2
            ax.text(j, i, "–" if missing else f"{data[i, j]:.1f}", ha="center", va="center",
                    fontsize=8, color="white" if dark else "black")
    if len(column_labels) > 1:
        ax.axvline(len(column_labels) - 1.5, color="white", linewidth=3)
    ax.set_xticks(range(len(column_labels)), column_labels, rotation=30, ha="right")
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    fig.colorbar(image, ax=ax, label=colour_label)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
