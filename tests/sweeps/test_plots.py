"""The report's plots: which lines are drawn, how they are labelled, what the curves average."""

from __future__ import annotations

from typing import Any

import matplotlib
import pytest

matplotlib.use("Agg")

from sweeps.report.plots import curves_plot, line_plot, mean_curve, write_plot  # noqa: E402


def lines_by_label(ax: Any) -> dict[str, list[tuple[float, float]]]:
    """The labelled lines of ``ax`` (plotted, or the data lines of error bars) as
    ``{label: [(x, y), ...]}``."""
    drawn = [(c.get_label(), c.lines[0]) for c in ax.containers]
    drawn += [(line.get_label(), line) for line in ax.get_lines()]
    return {name: [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]
            for name, line in drawn if not name.startswith("_")}


def llops(p: int, m: int, rank: int, size: int, acc: float) -> dict[str, Any]:
    """A table row of LLoPS at (p, m, t) of state size ``size``, as the report's rows give it
    (with the run-only hparams seed, lr and params that never split a line)."""
    return {"point": {"model.feature_map.init_args.p": str(p),
                      "model.feature_map.init_args.m": str(m),
                      "model.feature_map.init_args.rank": str(rank)},
            "hparams": {"feature_map": "LLoPS", "p": p, "m": m, "rank": rank, "seed": rank,
                        "lr": 1e-3, "params": 1000 * m * rank, "state_size": size},
            "mean": acc, "std": 0.0, "n": 3}


def test_rows_of_one_series_at_one_x_are_never_joined():
    """rank.yaml's acc_vs_state_size: p=4 at t=1, 2 and 4 (m=256) share a state size; each t
    is its own line (with the m·t=256 point at a smaller size), none zig-zagging at one x."""
    table = [llops(4, 256, 1, 400, 0.96), llops(4, 256, 2, 400, 0.92),
             llops(4, 256, 4, 400, 0.99), llops(4, 128, 2, 200, 0.79),
             llops(2, 256, 1, 400, 0.90)]
    fig, ax = line_plot(table, {"x": "state_size", "series": "p"})
    lines = lines_by_label(ax)
    assert lines == {"p=4 t=1": [(400, 96.0)], "p=4 t=2": [(200, 79.0), (400, 92.0)],
                     "p=4 t=4": [(400, 99.0)], "p=2 t=1": [(400, 90.0)]}
    for pts in lines.values():
        assert len({x for x, _ in pts}) == len(pts)  # no line has two points at one x
    assert [t.get_text() for t in ax.get_legend().get_texts()] == sorted(lines)
    matplotlib.pyplot.close(fig)


def test_a_series_with_one_row_per_x_stays_one_line():
    table = [llops(4, 256, t, 100 * t, 0.5 + t / 10) for t in (1, 2, 4)]
    fig, ax = line_plot(table, {"x": "rank", "series": "p"})
    assert lines_by_label(ax) == {"p=4": [(1, 60.0), (2, 70.0), (4, 90.0)]}
    matplotlib.pyplot.close(fig)


def curve_row(fm: str, d: int, curves: list, **hp: Any) -> dict[str, Any]:
    """A learning-curve row of ``fm`` at d_model ``d`` (BASED r=16, or LLoPS p=4 m=256 t=1)."""
    sizes = {"r": 16} if fm == "Based" else {"p": 4, "m": 256, "rank": 1}
    return {"point": {"config": f"configs/{fm}.yaml", "model.d_model": str(d)},
            "hparams": {"feature_map": fm, **sizes, "d_model": d, "seed": 0, "lr": 3e-4,
                        "params": 1000 * d, "state_size": 200 * d, **hp},
            "best_lr": 3e-4, "n": len(curves), "curves": curves, "curve_metric": "val/acc"}


def test_curve_legends_name_the_grid_keys_that_tell_rows_apart():
    """based_vs_llops: the same method at d_model 128 and 192 gets two legends, not one."""
    c = [[[100, 0.5], [200, 0.9]]]
    table = [curve_row("Based", 128, c), curve_row("Based", 192, c),
             curve_row("LLoPS", 128, c), curve_row("LLoPS", 192, c)]
    fig, ax = curves_plot(table, {"x": "step"})
    assert sorted(lines_by_label(ax)) == [
        "BASED r=16 d=128 (lr 0.0003, n=1)", "BASED r=16 d=192 (lr 0.0003, n=1)",
        "LLoPS p=4 m=256 t=1 d=128 (lr 0.0003, n=1)",
        "LLoPS p=4 m=256 t=1 d=192 (lr 0.0003, n=1)"]
    matplotlib.pyplot.close(fig)
    fig, ax = curves_plot(table[::2], {"x": "step"})  # one d each: nothing to add
    assert sorted(lines_by_label(ax)) == ["BASED r=16 (lr 0.0003, n=1)",
                                          "LLoPS p=4 m=256 t=1 (lr 0.0003, n=1)"]
    matplotlib.pyplot.close(fig)


def test_curve_n_counts_runs_with_a_curve_and_rows_without_one_are_noted(tmp_path):
    """bf16_parity_long / long_p_ablation: runs with no curve are not counted in ``n``; a row
    with none is named under the plot, never dropped silently."""
    table = [curve_row("LLoPS", 128, [[[100, 0.5], [200, 0.7]], [], None]),
             curve_row("Based", 128, [[], []])]
    fig, ax = curves_plot(table, {"x": "step"})
    assert list(lines_by_label(ax)) == ["LLoPS p=4 m=256 t=1 (lr 0.0003, n=1)"]
    assert [t.get_text() for t in fig.texts] == ["no val/acc curve for: BASED r=16"]
    matplotlib.pyplot.close(fig)
    fig, ax = curves_plot(table[1:], {"x": "step"})  # nothing to draw: said so
    assert lines_by_label(ax) == {} and fig.texts[0].get_text() == "no val/acc curve for: BASED r=16"
    matplotlib.pyplot.close(fig)
    assert write_plot(table[1:], {"x": "step", "name": "empty"}, tmp_path).stat().st_size > 0


def test_a_pruned_run_stops_counting_at_its_last_step():
    """A run pruned at step 500 leaves the mean after it; a run that stopped at the 0.99
    threshold still holds its value; a loss curve (``hold_at=None``) never holds."""
    pruned, full = [[250, 0.2], [500, 0.3]], [[250, 0.4], [500, 0.6], [750, 0.8], [1000, 0.9]]
    steps, mean, lo, hi = mean_curve([pruned, full])
    assert steps == [250, 500, 750, 1000]
    assert mean == pytest.approx([0.3, 0.45, 0.8, 0.9])  # was 0.55, 0.6: 0.3 held on
    assert (lo[-1], hi[-1]) == (0.9, 0.9)
    solved = [[250, 0.5], [500, 0.995]]
    assert mean_curve([solved, full])[1] == pytest.approx([0.45, 0.7975, 0.8975, 0.9475])
    assert mean_curve([solved, full], hold_at=None)[1] == pytest.approx([0.45, 0.7975, 0.8,
                                                                          0.9])
    assert mean_curve([[], None]) == ([], [], [], [])  # type: ignore[list-item]
