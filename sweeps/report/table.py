"""``table.md`` and ``table.csv``: the rows with the protocol's flags, and the claims.

``table.md`` and ``table.csv``: the rows (:mod:`sweeps.report.rows`) with the protocol's
flags, the per-slice means, and the spec's claims checked seed by seed.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

from arbench.tables import markdown_row, markdown_table, write_csv
from sweeps.paper import paper_gain_text
from sweeps.report.labels import label, matches_all
from sweeps.report.settings import task_rows
from sweeps.spec import SweepSpec


def write_table(spec: SweepSpec, table: list[dict[str, Any]], out: Path) -> list[Path]:
    """``table.md`` (a title, what the columns mean, a row per point, the claims) and
    ``table.csv`` (the same rows as numbers) in ``out``."""
    slice_names = sorted({k for r in table for k in r["slices"]},
                         key=lambda name: [int(x) for x in re.findall(r"\d+", name)])
    with_examples = any(r.get("example_acc") for r in table)  # runs since zoology's metric
    # beside the objective, the other accuracy: per example (zoology's) or per answer token
    by_example = spec.metric.startswith("val/example_acc")
    other, other_name = ("token_acc", "token acc %") if by_example else \
        ("example_acc", "example acc %")
    devices = sorted({d for r in table for d in r["devices"]})
    mixed = len(devices) > 1  # then each row says where its runs trained
    header = ["method", "d_model", "state size", "best lr (of n_lrs)", "acc % (mean ± std, n)",
              *([other_name] if with_examples else []),
              "paper %", "converged", "flags", *slice_names, "train time s (all runs)",
              *(["devices (all lrs)"] if mixed else [])]
    md = [f"# {spec.study} ({spec.profile} profile)", "",
          f"Objective {spec.metric}: the best validation of each run "
          f"({METRIC_TEXT.get(spec.metric, 'accuracy on one slice')}), "
          "mean ± sample std over seeds at the point's best learning rate. "
          "Per-slice columns are means at that lr, each run's slices in the objective's "
          "metric at its best validation of it. Paper values: SPEC.md §4 (their protocol, "
          "not this profile). *converged*: share of the best lr's runs (with a verdict) whose "
          "objective rose by < 1 point over their last quarter of steps (or reached 0.99; a "
          "diverged run has not converged); a row below 1 is not a converged result. "
          "Flags: runs that collapsed (loss back above 85% of its start after halving), "
          "runs at the best lr that had not converged, runs there stopped by the pruner "
          "(counted with the best they had reached), a best lr at the edge of the point's lrs "
          "(finished or not), runs unfinished or not started (a provisional row). "
          "One row per run: runs.csv." + (
              f" *{other_name.removesuffix(' %')}*: "
              + ("val/acc (micro accuracy over answer positions" if by_example else
                 "zoology's metric (mean over examples of each example's accuracy")
              + ", each run's best), mean ± std at the same lr." if with_examples else ""), "",
          *markdown_table(header)]
    if devices:
        md[2:2] = [f"Device: {', '.join(devices)}." + (
            " Runs trained on more than one machine: the last column names each row's."
            if mixed else ""), ""]
    if spec.description:
        md[2:2] = [spec.description, ""]
    csv_rows = []
    for r in table:
        hp = r["hparams"]
        paper = "" if r["paper"] is None else f"{r['paper']:.1f}"
        cells = [label(hp), hp.get("d_model"), hp.get("state_size"),
                 f"{r['best_lr']:g} ({r['n_lrs']})", mean_std_cell(r['mean'], r['std'], r['n']),
                 *([mean_std_text(r[other])] if with_examples else []), paper,
                 "–" if math.isnan(r["converged"]) else f"{r['converged']:.0%}", flags(r),
                 *[f"{100 * r['slices'][s]:.1f}" if s in r["slices"] else "–"
                   for s in slice_names],  # a run per setting tests that setting alone
                 f"{r['wall_time_s']:.0f}",
                 *([", ".join(short_device(d) for d in r["devices"])] if mixed else [])]
        md.append(markdown_row(cells))
        csv_rows.append({"method": label(hp), **{k: hp.get(k) for k in (
            "feature_map", "p", "m", "rank", "r", "d_model", "state_size", "params")},
            "best_lr": r["best_lr"], "acc_mean": r["mean"],
            "acc_std": r["std"] if r["n"] > 1 else None, "n": r["n"],  # one seed: no spread
            **({f"{other}_mean": statistics.fmean(r[other]) if r[other] else None}
               if with_examples else {}),
            "n_lrs": r["n_lrs"], "converged": r["converged"], "collapsed": r["collapsed"],
            "pruned": r["pruned"], "lr_at_edge": r["lr_at_edge"], "paper": r["paper"],
            **{f"acc_{s}": r["slices"].get(s) for s in slice_names},
            "wall_time_s": r["wall_time_s"]})
    settings = getattr(spec, "settings", [])
    claims = claim_rows(task_rows(spec, table) if settings else table,
                        getattr(spec, "claims", []))
    if claims:
        md += ["", "## Claims, seed by seed (each side at its best lr)", "",
               *([f"Each side's value per seed is its task score: the mean over the "
                  f"{len(settings)} settings of that seed's objective, each setting at its "
                  "own best lr; a point not yet run at every setting is not checked.", ""]
                 if settings else []),
               *claims_text(claims)]
    md_path, csv_path = out / "table.md", out / "table.csv"
    md_path.write_text("\n".join(md) + "\n")
    write_csv(csv_path, csv_rows, None if csv_rows else ["method"])
    return [md_path, csv_path]


def short_device(name: str) -> str:
    """``"cpu: Intel(R) Xeon(R) Processor"`` -> ``"Intel Xeon Processor"``: a device for a
    table cell."""
    return name.split(": ", 1)[-1].replace("(R)", "").replace("(TM)", "")


METRIC_TEXT = {"val/acc": "micro accuracy over answer positions",
               "val/example_acc": "zoology's metric: the mean over examples of each "
                                  "example's accuracy"}


def mean_std_cell(mean: float, std: float, n: int) -> str:
    """``"mean ± std (n)"`` in percent; ``"mean (1)"`` for one value, which has no spread."""
    spread = f" ± {100 * std:.1f}" if n > 1 else ""
    return f"{100 * mean:.1f}{spread} ({n})"


def mean_std_text(values: list[float]) -> str:
    """:func:`mean_std_cell` of ``values`` (sample std); ``"–"`` for no values."""
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean_std_cell(statistics.fmean(values), std, len(values))


def claim_rows(table: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim checked seed by seed: the row matching ``better`` against the row matching
    ``worse`` (each at its best lr), over the seeds both have: ``k`` of ``n`` seeds where the
    claim holds, and the mean ± sample std of the gap (better − worse). A claim with
    ``parity: t`` also gets ``parity``: whether the two rows' means (over all their seeds)
    differ by at most ``tolerance`` = max(the ``worse`` row's seed std, t points), and
    ``mean_gap``. A claim whose rows are missing or ambiguous, or (task rows) not yet run at
    every setting, says so in ``status``. A claim whose rows still have runs unfinished or not
    started (``unfinished``, ``not_started``: their best lr may change) is ``provisional``;
    ``seeds``: the study's seed count (the rows' ``seeds``), against which ``n`` may fall short."""
    out = []
    for claim in claims:
        picked = []
        for side in ("better", "worse"):
            hits = [r for r in table if matches_all(r["hparams"], claim[side])]
            picked.append(hits[0] if len(hits) == 1 else None)
            if len(hits) != 1:
                status = f"{len(hits)} rows match {side} {claim[side]}"
            elif hits[0].get("settings_done", 0) < hits[0].get("settings", 0):
                picked[-1] = None  # a task row (sweeps.report.settings) still missing settings
                status = (f"{side} has run at {hits[0]['settings_done']} of "
                          f"{hits[0]['settings']} settings")
            elif hits[0].get("short_of_seeds"):
                picked[-1] = None  # every setting has run, but no seed at each one's best lr
                status = f"{side} has no seed run at every setting's best lr yet"
        row = {"claim": claim["name"], "k": 0, "n": 0, "gap_mean": math.nan, "gap_std": math.nan,
               "gain": math.nan, "status": "ok", "provisional": False,
               "paper_gain": paper_gain_text(claim["paper_gain"]) if "paper_gain" in claim
               else None}
        if None in picked:
            out.append({**row, "status": status})
            continue
        a, b = picked
        row["provisional"] = any(r.get("unfinished") or r.get("not_started") for r in picked)
        row["seeds"] = max(int(r.get("seeds") or 0) for r in picked)  # the study's seed count
        seeds = sorted(set(a["seed_values"]) & set(b["seed_values"]), key=str)
        gaps = [a["seed_values"][s] - b["seed_values"][s] for s in seeds]
        row.update(k=sum(g > 0 for g in gaps), n=len(gaps),
                   gain=relative_gain([a["seed_values"][s] for s in seeds],
                                      [b["seed_values"][s] for s in seeds]),
                   gap_mean=statistics.fmean(gaps) if gaps else math.nan,
                   gap_std=statistics.stdev(gaps) if len(gaps) > 1 else math.nan)
        if "parity" in claim:
            row.update(parity_check(list(a["seed_values"].values()),
                                    list(b["seed_values"].values()), claim["parity"] / 100))
        out.append(row)
    return out


def parity_check(side: list[float], reference: list[float], points: float) -> dict[str, Any]:
    """Whether ``side``'s mean lies within ``reference``'s seed std (sample std; or ``points``,
    a fraction, when larger) of ``reference``'s mean: ``{parity, mean_gap, tolerance}``."""
    if not side or not reference:
        return {"parity": None, "mean_gap": math.nan, "tolerance": math.nan}
    spread = statistics.stdev(reference) if len(reference) > 1 else 0.0
    tolerance = max(spread, points)
    gap = statistics.fmean(side) - statistics.fmean(reference)
    return {"parity": abs(gap) <= tolerance, "mean_gap": gap, "tolerance": tolerance}


def relative_gain(better: list[float], worse: list[float]) -> float:
    """mean(better) / mean(worse) − 1 over the same seeds (nan when undefined)."""
    if not better or not worse or statistics.fmean(worse) == 0:
        return math.nan
    return statistics.fmean(better) / statistics.fmean(worse) - 1


def claims_text(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: "claim: holds in k of n seeds, mean gap ± std points", saying so when n
    is short of the study's seeds."""
    lines = []
    for r in rows:
        if r["status"] != "ok" or not r["n"]:
            lines.append(f"- {r['claim']}: not checked ({r['status']})")
            continue
        spread = f" ± {100 * r['gap_std']:.1f}" if r["n"] > 1 else ""
        paper = "" if not r.get("paper_gain") else \
            f"; relative gain {100 * r['gain']:+.1f}% (the paper: {r['paper_gain']})"
        parity = "" if r.get("parity") is None else (
            f"; parity {'holds' if r['parity'] else 'fails'}: means differ by "
            f"{100 * r['mean_gap']:+.1f} points, tolerance {100 * r['tolerance']:.1f} (the second "
            "side's seed std or the claim's points)")
        pending = " (provisional: runs unfinished, the best lr may change)" \
            if r.get("provisional") else ""
        short = f" (only {r['n']} of the study's {r['seeds']} seeds have a result on both sides)" \
            if r.get("seeds") and r["n"] < r["seeds"] else ""
        lines.append(f"- {r['claim']}: holds in {r['k']} of {r['n']} seeds, mean gap "
                     f"{100 * r['gap_mean']:+.1f}{spread} points{paper}{parity}{short}{pending}")
    return lines


def flags(row: dict[str, Any]) -> str:
    """The protocol's warnings for a table row: fewer seeds at the best lr than the study
    ran, failed runs with no result (left out of their lr's mean), diverged and collapsed runs
    (counted at their best before it), runs at the best lr that had not converged, runs there
    that the pruner stopped (counted with the best they had reached), best lr at a grid
    edge (of the point's lrs, finished or not), and runs still waiting or running or never
    queued (the row is provisional: its best lr may change)."""
    out = []
    if row.get("unfinished"):
        out.append(f"{row['unfinished']} runs unfinished (best lr may change)")
    if row.get("not_started"):
        out.append(f"{row['not_started']} runs not started")
    if row.get("seeds") and row["n"] < row["seeds"]:
        out.append(f"{row['n']} of {row['seeds']} seeds")
    if row.get("failed"):
        out.append(f"{row['failed']} failed (left out)")
    if row.get("diverged"):
        out.append(f"{row['diverged']} diverged")
    if row["collapsed"]:
        out.append(f"{row['collapsed']} collapsed")
    if row.get("not_converged"):  # of the runs with a verdict (a pruned run may have none)
        out.append(f"{row['not_converged']} of {row.get('verdicts', row['n'])} not converged")
    if row.get("pruned"):
        out.append(f"{row['pruned']} pruned")
    if row["lr_at_edge"]:
        out.append("best lr at grid edge")
    return "; ".join(out)

