"""Sweep tables and plots: mean ± std over seeds at each point's best learning rate.

A *point* is a trial's grid values less ``seed_everything`` and ``model.lr``. For every point
and lr, accuracy is averaged over seeds; the lr with the best mean is the point's best lr, and
the row reports mean ± std (sample std, n seeds) there, per-slice means, state size and the
paper's value where one matches (``sweeps.paper``), with the protocol's flags: ``n_lrs`` (lrs
tried), ``converged`` (share of the best lr's runs that converged, :mod:`arbench.curves`),
collapsed runs at the best lr, and whether the best lr sits at an edge of the lrs tried.
``runs.csv`` keeps one row per run (every trial, whatever its state).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from arbench.registry import FEATURE_MIXERS
from sweeps.paper import paper_gain_text, paper_value
from sweeps.spec import SweepSpec

VARYING = ("seed_everything", "model.lr")


def state_counts(trials: list[optuna.trial.FrozenTrial]) -> dict[str, int]:
    """``{complete, running, waiting, fail, pruned: count}`` of ``trials``."""
    counts = Counter(t.state.name.lower() for t in trials)
    return {k: counts.get(k, 0) for k in ("complete", "running", "waiting", "fail", "pruned")}


def count_states(study_name: str, storage: Any) -> dict[str, int]:
    study = optuna.load_study(study_name=study_name, storage=storage)
    return state_counts(study.get_trials(deepcopy=False))


def point_values(params: dict[str, Any]) -> dict[str, str]:
    """The grid point of ``params``: its values less seed and lr, as strings."""
    return {k: str(v) for k, v in params.items() if k not in VARYING}


def point_key(params: dict[str, Any]) -> tuple:
    """:func:`point_values` as a sorted tuple, the key :func:`by_point_and_lr` groups by."""
    return tuple(sorted(point_values(params).items()))


def run_time_left(trials: list[optuna.trial.FrozenTrial]) -> str:
    """``~H h of runs left (median run S s)``: the sum over queued and running trials of the
    median wall time of the finished runs (completed or pruned) nearest to it, those sharing
    the most of its grid values other than lr and seed (its own point's when it has any), in
    one worker's hours; empty when nothing is queued or nothing has finished. The study's own
    runs are preferred; a reused run (timed on another machine or load) counts only where it
    shares more values than any own run, so a queue of points unlike anything run yet (rank's
    t > 1 at p = 6 beside t = 1 runs reused from elsewhere) is not timed by the cheapest own
    kind. Points differ in cost (a delta-rule run takes longer than an additive one), so one
    median for the whole study misjudges a queue that holds mostly one kind. The median run
    is the own runs' (the reused runs' when there are none)."""
    from sweeps.worker import grid_point  # worker imports this module through refs

    left = [t for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    timed = [(point_values(grid_point(t)), t.user_attrs["wall_time_s"],
              not t.user_attrs.get("reused_from")) for t in trials
             if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
             and "wall_time_s" in t.user_attrs]
    if not left or not timed:
        return ""
    total = 0.0
    for trial in left:
        point = point_values(grid_point(trial))
        shared = [sum(point.get(k) == v for k, v in done.items()) for done, _, _ in timed]
        nearest = max(shared)
        near = [(s, own) for (_, s, own), n in zip(timed, shared) if n == nearest]
        if any(own for _, own in near):
            near = [(s, own) for s, own in near if own]
        total += statistics.median(s for s, _ in near)
    own_times = [s for _, s, own in timed if own]
    median = statistics.median(own_times or [s for _, s, _ in timed])
    return f"  ~{total / 3600:.1f} h of runs left (median run {median:.0f} s)"


def running_line(t: optuna.trial.FrozenTrial) -> str:
    """``  running: <run> since HH:MM, step S: V`` for a running trial (its last validation;
    ``no validation yet`` before the first; ``(a retry)`` when it replaces a failed trial)."""
    name = t.user_attrs.get("run_name", f"trial {t.number}")
    since = t.datetime_start.strftime("%H:%M") if t.datetime_start else "?"
    retry = " (a retry)" if "failed_trial" in t.system_attrs else ""
    if t.intermediate_values:
        step = max(t.intermediate_values)
        where = f"step {step}: {t.intermediate_values[step]:.4f}"
    else:
        where = "no validation yet"
    return f"  running: {name}{retry} since {since}, {where}"


def status_lines(storage: Any) -> list[str]:
    """One line per study: its trial counts by state and :func:`run_time_left`, then one
    :func:`running_line` per running trial."""
    from sweeps.worker import is_lock_study  # worker imports this module through refs

    lines = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if is_lock_study(summary.study_name):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        lines.append(f"{summary.study_name:<24} " + "  ".join(
            f"{k} {v}" for k, v in state_counts(trials).items()) + run_time_left(trials))
        lines += [running_line(t) for t in trials if t.state == TrialState.RUNNING]
    return lines or ["no studies"]


Trials = list[optuna.trial.FrozenTrial]


def run_value(t: optuna.trial.FrozenTrial, maximize: bool = True) -> float:
    """A run's objective: its value when it completed; for a run the pruner stopped, the
    best it had reached (its best intermediate value), as :mod:`sweeps.halving` counts it."""
    if t.state == TrialState.PRUNED:
        reached = t.intermediate_values.values()
        return max(reached) if maximize else min(reached)
    return t.value


def by_point_and_lr(trials: Trials) -> dict[tuple, dict[float, Trials]]:
    """Finished ``trials`` (completed, or pruned after at least one validation) grouped by
    grid point (params less seed and lr), then by lr. A pruned run stays in its lr's group,
    counted by :func:`run_value`: leaving it out would average that lr over only the seeds
    that survived halving."""
    grouped: dict[tuple, dict[float, Trials]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t.state == TrialState.COMPLETE or (t.state == TrialState.PRUNED
                                              and t.intermediate_values):
            grouped[point_key(t.params)][t.params.get("model.lr", 0.0)].append(t)
    return grouped


def best_lr(by_lr: dict[float, Trials], maximize: bool = True) -> float:
    """The lr whose trials have the best mean objective (over seeds, :func:`run_value`)."""
    sign = 1 if maximize else -1
    return max(by_lr, key=lambda lr: sign * statistics.fmean(run_value(t, maximize)
                                                             for t in by_lr[lr]))


def rows(spec: SweepSpec, storage: Any) -> list[dict[str, Any]]:
    """One row per point at its best lr."""
    study = optuna.load_study(study_name=spec.study, storage=storage)
    out = []
    maximize = spec.direction == "maximize"
    for point, by_lr in by_point_and_lr(study.get_trials(deepcopy=False)).items():
        best = best_lr(by_lr, maximize)
        trials = by_lr[best]
        values = [run_value(t, maximize) for t in trials]
        hp = dict(next((t.user_attrs["hparams"] for ts in by_lr.values() for t in ts
                        if t.user_attrs.get("hparams")), {}))
        slices: dict[str, list[float]] = defaultdict(list)
        for t in trials:
            for name, acc in (t.user_attrs.get("slices") or {}).items():
                slices[name].append(acc)
        examples = [t.user_attrs["example_acc"] for t in trials
                    if t.user_attrs.get("example_acc") is not None]
        tokens = [t.user_attrs["val_acc"] for t in trials
                  if t.user_attrs.get("val_acc") is not None]
        verdicts = [t.user_attrs.get("converged") for t in trials]
        known = [bool(v) for v in verdicts if v is not None]
        lrs = sorted(by_lr)
        out.append({
            "point": dict(point), "hparams": hp, "best_lr": best, "n_lrs": len(lrs),
            "lr_at_edge": len(lrs) > 1 and best in (lrs[0], lrs[-1]),
            "converged": sum(known) / len(known) if known else math.nan,
            "not_converged": len(known) - sum(known),
            "collapsed": sum(t.user_attrs.get("collapsed_at") is not None for t in trials),
            "devices": sorted({str(t.user_attrs["device"]) for ts in by_lr.values() for t in ts
                               if t.user_attrs.get("device")}),
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values),
            "pruned": sum(t.state == TrialState.PRUNED for t in trials),
            "lr_means": {lr: statistics.fmean(run_value(t, maximize) for t in ts)
                         for lr, ts in by_lr.items()},
            "seed_values": {t.params.get("seed_everything"): run_value(t, maximize)
                            for t in trials},
            "curves": [t.user_attrs.get("val_curve") or [] for t in trials],
            "slices": {k: statistics.fmean(v) for k, v in sorted(slices.items())},
            "slice_values": {k: list(v) for k, v in sorted(slices.items())},
            "example_acc": examples, "token_acc": tokens,
            "paper": None if variant(hp) else paper_value(hp),  # the paper's: plain, from scratch
            "wall_time_s": sum(t.user_attrs.get("wall_time_s", 0.0) for ts in by_lr.values()
                               for t in ts),
        })
    order = ("feature_map", "p", "rank", "m", "r", "d_model")
    out.sort(key=lambda r: tuple(str(r["hparams"].get(k, "")).zfill(6) for k in order))
    return out


def label(hp: dict[str, Any]) -> str:
    """Row name: method and its sizes, plus the denominator when there is one."""
    fm = hp.get("feature_map", "?")
    if fm == "Based":
        text = f"BASED r={hp.get('r')}"
    elif fm == "softmax":
        return "softmax"
    else:  # a map's sizes, those it has (elu+1 has no degree: its m is the head dim)
        sizes = [f"{k}={hp[k]}" for k in ("p", "m") if hp.get(k) is not None]
        text = " ".join([fm, *sizes])
        text += f" t={hp['rank']}" if fm == "LLoPS" else ""
    norm = hp.get("normalize")
    text += f" denominator={norm}" if norm not in (None, "none") else ""
    return text + variant(hp) + training_label(hp)


TRAINING_DEFAULTS = {"embedding_dropout": 0.0, "betas": "0.9,0.98",
                     "weight_decay_scope": "matrices", "lr_schedule": "cosine", "shuffle": True,
                     "precision": "32-true"}
"""How a run trained when its hparams do not say (runs recorded before these were hparams)."""

def with_training_defaults(hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` with :data:`TRAINING_DEFAULTS` filled in where it holds no value."""
    return {**TRAINING_DEFAULTS, **{k: v for k, v in hp.items() if v is not None}}


ZOOLOGY_RECIPE = {"embedding_dropout": 0.1, "betas": "0.9,0.999", "weight_decay_scope": "all",
                  "lr_schedule": "zoology", "shuffle": False}
"""The hparams of ``configs/recipes/zoology.yaml``."""


def training_label(hp: dict[str, Any]) -> str:
    """How a row's runs were trained where it is not arbench's default, e.g.
    ``" zoology recipe bf16-mixed"``: the recipe switches (all of zoology's as one name), then
    the precision. Runs recorded before these were hparams count as the defaults."""
    hp = with_training_defaults(hp)
    parts = []
    if all(hp[k] == v for k, v in ZOOLOGY_RECIPE.items()):
        parts.append("zoology recipe")
    else:
        if hp["embedding_dropout"]:
            parts.append(f"emb-dropout {hp['embedding_dropout']:g}")
        if hp["betas"] != TRAINING_DEFAULTS["betas"]:
            parts.append(f"betas {hp['betas']}")
        if hp["weight_decay_scope"] != "matrices":
            parts.append("wd on all params")
        if hp["lr_schedule"] != "cosine":
            parts.append(f"{hp['lr_schedule']} schedule")
        if not hp["shuffle"]:
            parts.append("unshuffled")
    if hp["precision"] not in ("32-true", "32"):
        parts.append(str(hp["precision"]))
    return "".join(f" {p}" for p in parts)


def variant(hp: dict[str, Any]) -> str:
    """The diagnosis switches a row's run used, e.g. ``" qk-norm affine"`` (empty: none)."""
    parts = [name for name, on in (("qk-norm", hp.get("qk_norm")), ("φ²", hp.get("square")),
                                   ("affine", hp.get("affine"))) if on]
    rules = [m for m in str(hp.get("mixers", "")).split(",")
             if m in FEATURE_MIXERS and m != "linear"]
    parts += [f"[{rule}]" for rule in dict.fromkeys(rules)]  # gated / delta state updates
    if hp.get("init_from"):
        parts.append("(warm start)")
    if hp.get("block") == "zoology":
        parts.append("zoology block")
    if hp.get("init_std") not in (None, "default"):
        parts.append(f"init N(0, {hp['init_std']}²)")
    if hp.get("init") not in (None, "variance"):
        parts.append(f"init {hp['init']}")
    wd, fm_wd = hp.get("weight_decay"), hp.get("feature_map_weight_decay")
    if fm_wd is not None and wd is not None and fm_wd != wd:
        parts.append(f"feature-map wd={fm_wd:g}")
    return "".join(f" {p}" for p in parts)


def variant_name(hp: dict[str, Any]) -> str:
    """:func:`variant` as a name, e.g. ``"qk-norm"``; ``"baseline"`` for none."""
    return variant(hp).strip() or "baseline"


def write_table(spec: SweepSpec, table: list[dict[str, Any]], out: Path) -> list[Path]:
    slice_names = sorted({k for r in table for k in r["slices"]},
                         key=lambda name: [int(x) for x in re.findall(r"\d+", name)])
    with_examples = any(r.get("example_acc") for r in table)  # runs since zoology's metric
    # beside the objective, the other accuracy: per example (zoology's) or per answer token
    by_example = spec.metric.startswith("val/example_acc")
    other, other_name = ("token_acc", "token acc %") if by_example else \
        ("example_acc", "example acc %")
    header = ["method", "d_model", "state size", "best lr (of n_lrs)", "acc % (mean ± std, n)",
              *([other_name] if with_examples else []),
              "paper %", "converged", "flags", *slice_names, "train time s (all runs)"]
    md = [f"# {spec.study} ({spec.profile} profile)", "",
          f"Objective {spec.metric}: the best validation of each run "
          f"({METRIC_TEXT.get(spec.metric, 'accuracy on one slice')}), "
          "mean ± sample std over seeds at the point's best learning rate. "
          "Per-slice columns are means at that lr. Paper values: SPEC.md §4 (their protocol, "
          "not this profile). *converged*: share of the best lr's runs whose val/acc rose by "
          "< 1 point over their last quarter of steps (or reached 0.99); a row below 1 is "
          "not a converged result. Flags: runs that collapsed (loss back above 85% of its "
          "start after halving), runs at the best lr that had not converged, runs there "
          "stopped by the pruner (counted with the best they had reached), a best lr at the "
          "edge of the lrs tried. One row per run: runs.csv." + (
              f" *{other_name.removesuffix(' %')}*: "
              + ("val/acc (micro accuracy over answer positions" if by_example else
                 "zoology's metric (mean over examples of each example's accuracy")
              + ", each run's best), mean ± std at the same lr." if with_examples else ""), "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    devices = sorted({d for r in table for d in r["devices"]})
    if devices:
        md[2:2] = [f"Device: {', '.join(devices)}.", ""]
    if spec.description:
        md[2:2] = [spec.description, ""]
    csv_rows = []
    for r in table:
        hp = r["hparams"]
        paper = "" if r["paper"] is None else f"{r['paper']:.1f}"
        cells = [label(hp), hp.get("d_model"), hp.get("state_size"),
                 f"{r['best_lr']:g} ({r['n_lrs']})",
                 f"{100 * r['mean']:.1f} ± {100 * r['std']:.1f} ({r['n']})",
                 *([mean_std_text(r[other])] if with_examples else []), paper,
                 "–" if math.isnan(r["converged"]) else f"{r['converged']:.0%}", flags(r),
                 *[f"{100 * r['slices'].get(s, float('nan')):.1f}" for s in slice_names],
                 f"{r['wall_time_s']:.0f}"]
        md.append("| " + " | ".join(str(c) for c in cells) + " |")
        csv_rows.append({"method": label(hp), **{k: hp.get(k) for k in (
            "feature_map", "p", "m", "rank", "r", "d_model", "state_size", "params")},
            "best_lr": r["best_lr"], "acc_mean": r["mean"], "acc_std": r["std"], "n": r["n"],
            **({f"{other}_mean": statistics.fmean(r[other]) if r[other] else None}
               if with_examples else {}),
            "n_lrs": r["n_lrs"], "converged": r["converged"], "collapsed": r["collapsed"],
            "pruned": r["pruned"], "lr_at_edge": r["lr_at_edge"], "paper": r["paper"],
            **{f"acc_{s}": r["slices"].get(s) for s in slice_names},
            "wall_time_s": r["wall_time_s"]})
    claims = claim_rows(table, getattr(spec, "claims", []))
    if claims:
        md += ["", "## Claims, seed by seed (each side at its best lr)", "",
               *claims_text(claims)]
    md_path, csv_path = out / "table.md", out / "table.csv"
    md_path.write_text("\n".join(md) + "\n")
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(csv_rows[0]) if csv_rows else ["method"])
        writer.writeheader()
        writer.writerows(csv_rows)
    return [md_path, csv_path]


METRIC_TEXT = {"val/acc": "micro accuracy over answer positions",
               "val/example_acc": "zoology's metric: the mean over examples of each "
                                  "example's accuracy"}


def mean_std_text(values: list[float]) -> str:
    """``"mean ± std (n)"`` in percent; ``"–"`` for no values."""
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * std:.1f} ({len(values)})"


def claim_rows(table: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each claim checked seed by seed: the row matching ``better`` against the row matching
    ``worse`` (each at its best lr), over the seeds both have: ``k`` of ``n`` seeds where the
    claim holds, and the mean ± sample std of the gap (better − worse). A claim whose rows are
    missing or ambiguous says so in ``status``."""
    out = []
    for claim in claims:
        picked = []
        for side in ("better", "worse"):
            hits = [r for r in table if all(_matches(r["hparams"], k, v)
                                            for k, v in claim[side].items())]
            picked.append(hits[0] if len(hits) == 1 else None)
            if len(hits) != 1:
                status = f"{len(hits)} rows match {side} {claim[side]}"
        row = {"claim": claim["name"], "k": 0, "n": 0, "gap_mean": math.nan, "gap_std": math.nan,
               "gain": math.nan, "status": "ok",
               "paper_gain": paper_gain_text(claim["paper_gain"]) if "paper_gain" in claim
               else None}
        if None in picked:
            out.append({**row, "status": status})
            continue
        a, b = picked
        seeds = sorted(set(a["seed_values"]) & set(b["seed_values"]), key=str)
        gaps = [a["seed_values"][s] - b["seed_values"][s] for s in seeds]
        row.update(k=sum(g > 0 for g in gaps), n=len(gaps),
                   gain=relative_gain([a["seed_values"][s] for s in seeds],
                                      [b["seed_values"][s] for s in seeds]),
                   gap_mean=statistics.fmean(gaps) if gaps else math.nan,
                   gap_std=statistics.stdev(gaps) if len(gaps) > 1 else math.nan)
        out.append(row)
    return out


def relative_gain(better: list[float], worse: list[float]) -> float:
    """mean(better) / mean(worse) − 1 over the same seeds (nan when undefined)."""
    if not better or not worse or statistics.fmean(worse) == 0:
        return math.nan
    return statistics.fmean(better) / statistics.fmean(worse) - 1


def claims_text(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: "claim: holds in k of n seeds, mean gap ± std points"."""
    lines = []
    for r in rows:
        if r["status"] != "ok" or not r["n"]:
            lines.append(f"- {r['claim']}: not checked ({r['status']})")
            continue
        spread = f" ± {100 * r['gap_std']:.1f}" if r["n"] > 1 else ""
        paper = "" if not r.get("paper_gain") else \
            f"; relative gain {100 * r['gain']:+.1f}% (the paper: {r['paper_gain']})"
        lines.append(f"- {r['claim']}: holds in {r['k']} of {r['n']} seeds, mean gap "
                     f"{100 * r['gap_mean']:+.1f}{spread} points{paper}")
    return lines


def flags(row: dict[str, Any]) -> str:
    """The protocol's warnings for a table row: collapsed runs, runs at the best lr that had
    not converged, runs there that the pruner stopped (counted with the best they had
    reached), best lr at a grid edge."""
    out = []
    if row["collapsed"]:
        out.append(f"{row['collapsed']} collapsed")
    if row.get("not_converged"):
        out.append(f"{row['not_converged']} of {row['n']} not converged")
    if row.get("pruned"):
        out.append(f"{row['pruned']} pruned")
    if row["lr_at_edge"]:
        out.append("best lr at grid edge")
    return "; ".join(out)


RUN_FIELDS = ("trial", "state", "lr", "seed", "val_acc", "last_val_acc", "steps", "converged",
              "collapsed_at", "wall_time_s", "fail_reason", "reused_from")


def run_rows(spec: SweepSpec, storage: Any) -> list[dict[str, Any]]:
    """One row per trial of the study: its grid values, lr, seed, best and last val/acc,
    steps, the convergence and collapse verdicts, wall time and state (fail reason)."""
    study = optuna.load_study(study_name=spec.study, storage=storage)
    trials = study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in t.params if k not in VARYING})
    out = []
    for t in trials:
        ua = dict(t.user_attrs)
        if t.state == TrialState.PRUNED and t.intermediate_values:
            steps = sorted(t.intermediate_values)
            ua.setdefault("val_acc", run_value(t, spec.direction == "maximize"))
            ua.setdefault("last_val_acc", t.intermediate_values[steps[-1]])
            ua.setdefault("global_step", steps[-1])
        out.append({"trial": t.number, "state": t.state.name.lower(),
                    **{k: t.params.get(k) for k in keys},
                    "lr": t.params.get("model.lr"), "seed": t.params.get("seed_everything"),
                    "val_acc": ua.get("val_acc"), "last_val_acc": ua.get("last_val_acc"),
                    "steps": ua.get("global_step"), "converged": ua.get("converged"),
                    "collapsed_at": ua.get("collapsed_at"), "wall_time_s": ua.get("wall_time_s"),
                    "fail_reason": ua.get("fail_reason"), "reused_from": ua.get("reused_from")})
        if any("example_acc" in tr.user_attrs for tr in trials):  # runs since zoology's metric
            out[-1].update(example_acc=ua.get("example_acc"),
                           last_example_acc=ua.get("last_example_acc"))
    return out


def write_runs(spec: SweepSpec, storage: Any, out: Path) -> Path:
    """``runs.csv``: :func:`run_rows`, one row per run."""
    runs = run_rows(spec, storage)
    path = out / "runs.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(runs[0]) if runs else list(RUN_FIELDS))
        writer.writeheader()
        writer.writerows(runs)
    return path


def _matches(hp: dict[str, Any], key: str, want: Any) -> bool:
    """``hp[key] == want`` (or ``in want`` for a list); ``"m*rank"`` multiplies hparams;
    ``"variant"`` is the row's diagnosis switches as its label names them
    (:func:`variant_name`)."""
    if key == "variant":
        name = variant_name(hp)
        return name in want if isinstance(want, list) else name == want
    hp = with_training_defaults(hp)
    names = key.split("*")
    if any(hp.get(n) is None for n in names):
        return False
    value = math.prod(hp[n] for n in names) if len(names) > 1 else hp[key]
    return value in want if isinstance(want, list) else value == want


def mean_curve(curves: list[list]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps and the mean, min and max of val/acc over ``curves`` ((step, acc) lists) at each
    step any of them reached; a run that stopped early (at the 0.99 threshold) holds its last
    value."""
    steps = sorted({int(s) for c in curves for s, _ in c})
    rows = []
    for c in curves:
        if not c:
            continue
        at = dict((int(s), a) for s, a in c)
        last, row = None, []
        for s in steps:
            last = at.get(s, last)
            row.append(last)
        rows.append(row)
    cols = [[r[i] for r in rows if r[i] is not None] for i in range(len(steps))]
    keep = [i for i, col in enumerate(cols) if col]
    return ([steps[i] for i in keep], [statistics.fmean(cols[i]) for i in keep],
            [min(cols[i]) for i in keep], [max(cols[i]) for i in keep])


def write_curves(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """Validation accuracy against training step (``x: step``): one line per row (a point at
    its best lr), the mean over its seeds with their range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = plot.get("where") or {}
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in table:
        if not all(_matches(r["hparams"], k, v) for k, v in where.items()):
            continue
        steps, mean, lo, hi = mean_curve(r["curves"])
        if not steps:
            continue
        line, = ax.plot(steps, [100 * v for v in mean], marker=".",
                        label=f"{label(r['hparams'])} "
                              f"(lr {r['best_lr']:g}, n={r['n']})")
        ax.fill_between(steps, [100 * v for v in lo], [100 * v for v in hi], alpha=0.15,
                        color=line.get_color())
    return finish_plot(fig, ax, "training step", "val accuracy % (mean over seeds; range shaded)",
                       plot.get("title", "learning curves at each point's best lr"),
                       out / f"{plot.get('name', 'learning_curves')}.png", legend_size=7)


def write_plot(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """Accuracy (mean ± std) against ``plot['x']``, one line per ``plot['series']`` value (an
    hparam, or ``variant``: the diagnosis switches), over the rows matching ``plot['where']``
    (``{hparam: value or [values]}``, optional). ``x: step`` draws learning curves instead
    (:func:`write_curves`); ``marker_by: method`` draws unjoined points instead
    (:func:`write_marked_plot`)."""
    if plot["x"] == "step":
        return write_curves(table, plot, out)
    if plot.get("marker_by") == "method":
        return write_marked_plot(table, plot, out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, series_key = plot["x"], plot.get("series", "feature_map")
    groups: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in plotted_rows(table, plot):
        hp = r["hparams"]
        if series_key == "feature_map":
            name = str(hp.get("feature_map"))
        elif series_key == "variant":  # the diagnosis switches (report.variant)
            name = variant_name(hp)
        else:
            name = f"{series_key}={hp.get(series_key)}"
        groups[name].append((float(hp[x_key]), *plotted_value(r, plot)))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, pts in sorted(groups.items()):
        pts.sort()
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts],
                    marker="o", capsize=3, label=name)
    if plot.get("xscale") == "log":
        log_x_axis(ax, {x for pts in groups.values() for x, _, _ in pts})
    return finish_plot(fig, ax, x_key, y_label(plot),
                       plot.get("title", f"accuracy vs {x_key}"),
                       out / f"{plot.get('name', 'acc_vs_' + x_key)}.png")


def write_marked_plot(table: list[dict[str, Any]], plot: dict[str, Any], out: Path) -> Path:
    """Accuracy (mean ± std) against ``plot['x']`` as unjoined points: a colour per
    ``plot['series']`` hparam value and a marker shape per method (:func:`label` without the
    series hparam), so that
    methods sharing an x (LLoPS p=2 and p=4 have one state size) stay apart. Each series is
    nudged sideways by 1.5% of x so that its error bars do not hide another's."""
    import matplotlib

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
    return finish_plot(fig, ax, x_key, y_label(plot),
                       plot.get("title", f"accuracy vs {x_key}"),
                       out / f"{plot.get('name', 'acc_vs_' + x_key)}.png", handles=handles)


def plotted_rows(table: list[dict[str, Any]], plot: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``table`` that have ``plot['x']`` and match ``plot['where']`` (and, with
    ``plot['y']`` a slice, that have that slice)."""
    where = plot.get("where") or {}
    y = plot.get("y")
    return [r for r in table if r["hparams"].get(plot["x"]) is not None
            and all(_matches(r["hparams"], k, v) for k, v in where.items())
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
    import matplotlib.ticker

    ax.set_xscale("log")
    xs_sorted = sorted(xs)
    if 0 < len(xs_sorted) <= 8:
        ax.set_xticks(xs_sorted, [f"{x:g}" for x in xs_sorted], rotation=rotation)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def finish_plot(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path,
                legend_size: int = 8, handles: list[Any] | None = None) -> Path:
    """Label, grid and legend ``ax``, save ``fig`` to ``path`` (120 dpi) and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(spec: SweepSpec, storage: Any, results: Path) -> list[Path]:
    """``results/<study>/table.md``, ``table.csv``, ``runs.csv``, ``halving.md`` (the lr
    sub-grid under successive halving, :mod:`sweeps.halving`) and the spec's plots."""
    out = results / spec.study
    out.mkdir(parents=True, exist_ok=True)
    table = rows(spec, storage)
    paths = write_table(spec, table, out) + [write_runs(spec, storage, out)]
    from sweeps.halving import write_halving

    study = optuna.load_study(study_name=spec.study, storage=storage)
    paths += write_halving(spec, study.get_trials(deepcopy=False), out)
    plots = spec.plots or [{"x": "state_size", "series": "feature_map", "xscale": "log"}]
    paths += [write_plot(table, plot, out) for plot in plots]
    return paths
