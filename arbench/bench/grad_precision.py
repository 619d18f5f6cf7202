"""How far the bf16-mixed gradient lies from the fp32 one, and which layer puts it there:
``python -m arbench.bench.grad_precision --config configs/p4.yaml [--config PROFILE]
[--ckpt CKPT] [--batches 6] [--out DIR]``.

The model is built as ``main.py fit`` builds it from the same ``--config`` files (and
``--set key=value`` overrides, e.g. ``--set model.lr=3e-4``), with a checkpoint's weights when
``--ckpt`` is given (a run's ``last.ckpt`` or one saved mid-run), else at its seed's
initialisation. On ``--batches`` K training batches of its data it computes the gradient of
the training loss (mean cross-entropy over answer tokens) in fp32 and under CPU bf16 autocast
(fp32 weights, as ``--trainer.precision bf16-mixed`` trains), with no layer, each mixer kind
and every mixer kept in fp32 (``model.fp32_mixers``); the attention layers' parts
(:data:`PARTS`: their feature maps, their projections, their state products), each in fp32
alone and with the conv layer; and each of those again with the output head in fp32 (its
logits unrounded; with every mixer and the head in fp32 nothing is left in bf16, and the
gradient is fp32's exactly). Per arm, over all parameters:

- ``one batch``: the relative error ‖g_bf16 − g_fp32‖ / ‖g_fp32‖, mean over the K batches;
- ``mean of K``: the relative error of the K batches' summed gradients. Rounding errors that
  are independent between batches shrink about as 1/√K in it; an error that does not shrink is
  systematic (the same bias on every batch, e.g. from the weights rounded to bf16), the kind
  an optimiser accumulates;
- the parameter tensors with the largest error of the summed gradient.

Writes ``grad_precision.md`` and ``grad_precision.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from arbench.checks import CliError, OneLineParser
from arbench.ckpt_check import check_checkpoint, load_tensors
from arbench.cli import build_cli
from arbench.model import RecallModel
from arbench.noise import quiet_known_noise
from arbench.profiles import default_profile_note, with_default_profile
from arbench.tables import markdown_table

Grads = dict[str, torch.Tensor]


PARTS = ("feature maps", "attention projections", "state products")
"""The parts of the attention layers an arm may keep in fp32 besides whole mixers."""
PART_ARMS = (("feature maps",), ("attention projections",), ("state products",),
             ("feature maps", "state products"))
"""The sets of :data:`PARTS` the arms keep in fp32; the last keeps the features unrounded from
the map through the state products."""

Target = tuple[torch.nn.Module, str]
"""A module and the name of its method that an arm runs in fp32."""


def fp32_targets(model: RecallModel, part: str) -> list[Target]:
    """The methods of ``part``: ``"head"`` (the output head's forward), ``"feature maps"``
    (every attention layer's φ_Q and φ_K), ``"attention projections"`` (its q, k, v and output
    projections) or ``"state products"`` (its ``mix``: the causal products of features and
    values, the chunked attention, with the features and values cast to fp32)."""
    if part == "head":
        return [(model.head, "forward")]
    attention = [block.mixer for block in model.blocks if hasattr(block.mixer, "phi_q")]
    if part == "state products":
        return [(mixer, "mix") for mixer in attention]
    names = ("phi_q", "phi_k") if part == "feature maps" else ("qkv", "out")
    return [(getattr(mixer, n), "forward") for mixer in attention for n in names]


@contextmanager
def kept_in_fp32(model: RecallModel, names: list[str],
                 parts: tuple[str, ...] = ()) -> Iterator[None]:
    """Within the block, the layers whose mixer is one of ``names`` run in fp32 under
    autocast (as ``model.fp32_mixers`` builds them), and so do the methods of each of
    ``parts`` (:func:`fp32_targets`: autocast off, floating inputs cast to fp32, so e.g. the
    head's logits or the feature maps' products are not rounded to bf16); restored after."""
    before = [block.fp32_mixer for block in model.blocks]
    for block, kind, was in zip(model.blocks, model.mixer_names, before):
        block.fp32_mixer = was or kind in names
    targets = [t for part in parts for t in fp32_targets(model, part)]
    for obj, method in targets:
        setattr(obj, method, _in_fp32(obj, method))  # an instance attribute shadows the class's
    try:
        yield
    finally:
        for block, was in zip(model.blocks, before):
            block.fp32_mixer = was
        for obj, method in targets:
            delattr(obj, method)


def _in_fp32(obj: torch.nn.Module, method: str) -> Any:
    """``obj``'s own ``method`` with autocast off and its floating tensor arguments in fp32."""
    bound = getattr(type(obj), method)

    def run(*args: Any, **kwargs: Any) -> Any:
        args = tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a
                     for a in args)
        with torch.autocast("cpu", enabled=False):
            return bound(obj, *args, **kwargs)
    return run


def loss_gradient(model: RecallModel, inputs: torch.Tensor, labels: torch.Tensor,
                  bf16: bool) -> Grads:
    """Gradient of the mean answer-token cross-entropy of ``inputs``/``labels`` ``(b, n)``,
    under CPU bf16 autocast when ``bf16``; one fp32 tensor per named parameter."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model.loss(inputs, labels)
    loss.backward()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def relative_error(got: Grads, want: Grads) -> float:
    """‖got − want‖ / ‖want‖ over all tensors of ``want``."""
    num = sum(float((got[n] - want[n]).pow(2).sum()) for n in want)
    den = sum(float(want[n].pow(2).sum()) for n in want)
    return (num / den) ** 0.5


def arms(model: RecallModel) -> list[tuple[str, list[str], tuple[str, ...]]]:
    """``(name, mixers kept in fp32, other parts kept in fp32)``: none, each mixer kind alone,
    all of them, then (where the model has attention layers with feature maps) each set of
    :data:`PART_ARMS` alone and with the conv layer; each of those with the bf16 head, then
    with the head in fp32."""
    kinds = list(dict.fromkeys(model.mixer_names))
    subsets: list[tuple[str, list[str], tuple[str, ...]]] = [("bf16-mixed", [], ())]
    subsets += [(f"{k} in fp32", [k], ()) for k in kinds]
    if len(kinds) > 1:
        subsets.append(("every mixer in fp32", kinds, ()))
    for parts in PART_ARMS if fp32_targets(model, "feature maps") else ():
        name = " + ".join(parts)
        subsets.append((f"{name} in fp32", [], parts))
        if "conv" in kinds:
            subsets.append((f"conv + {name} in fp32", ["conv"], parts))
    with_head = [("head in fp32" if name == "bf16-mixed" else f"{name} + head in fp32", keep,
                  (*parts, "head")) for name, keep, parts in subsets]
    return subsets + with_head


def compare(model: RecallModel, batches: list[tuple[torch.Tensor, torch.Tensor]],
            worst: int = 3) -> list[dict[str, Any]]:
    """One row per arm of :func:`arms`: ``one_batch``, ``mean_of_k`` and the ``worst``
    parameters' errors of the summed gradient, against fp32 on the same ``batches``."""
    refs = [loss_gradient(model, x, y, bf16=False) for x, y in batches]
    ref_sum = {n: sum(r[n] for r in refs) for n in refs[0]}
    rows = []
    for name, keep, parts in arms(model):
        with kept_in_fp32(model, keep, parts):
            grads = [loss_gradient(model, x, y, bf16=True) for x, y in batches]
        got_sum = {n: sum(g[n] for g in grads) for n in ref_sum}
        per_param = {n: relative_error({n: got_sum[n]}, {n: ref_sum[n]}) for n in ref_sum
                     if float(ref_sum[n].norm()) > 0}
        top = sorted(per_param.items(), key=lambda kv: -kv[1])[:worst]
        rows.append({"arm": name, "fp32_mixers": keep, "fp32_parts": list(parts),
                     "one_batch": sum(relative_error(g, r) for g, r in zip(grads, refs))
                     / len(batches),
                     "mean_of_k": relative_error(got_sum, ref_sum),
                     "worst": [{"param": n.removeprefix("model."), "error": e} for n, e in top]})
    return rows


def load_error_reason(err: RuntimeError, shown: int = 3) -> str:
    """``load_state_dict``'s error on one line: its size mismatches (key and both shapes), then
    its unexpected and missing keys (how many, the first ``shown``); its first line alone names
    none of them."""
    lines = [line.strip().rstrip(".") for line in str(err).splitlines()[1:] if line.strip()]
    sizes = [line for line in lines if line.startswith("size mismatch")]
    parts = [line.replace("copying a param with shape", "checkpoint")
             .replace(" from checkpoint,", ",").replace("the shape in current model is", "model")
             for line in sizes]
    for line in lines:
        head, sep, keys = line.partition(" in state_dict: ")
        if sep:
            names = [k.strip().strip('"') for k in keys.split(",") if k.strip()]
            more = f", … ({len(names)} in all)" if len(names) > shown else ""
            parts.append(f"{head.lower()} {', '.join(names[:shown])}{more}")
    return "; ".join(parts) or str(err).splitlines()[0]


def build(configs: list[str], sets: list[str], ckpt: str | None,
          ) -> tuple[RecallModel, Any]:
    """The model and datamodule ``main.py fit --config …`` builds (the default profile when
    none of ``configs`` is one), weights from ``ckpt``."""
    args: list[str] = []
    for c in configs:
        args += ["--config", c]
    for kv in sets:
        key, sep, value = kv.partition("=")
        if not sep:
            raise CliError(f"--set {kv!r}: expected key=value, e.g. model.lr=3e-4")
        args += [f"--{key}", value]
    args += ["--trainer.precision", "32-true", "--trainer.logger", "false"]
    with_profile, defaulted = with_default_profile(["fit", *args], ["fit"])  # as main.py fit
    if defaulted:
        print(default_profile_note(), file=sys.stderr)
    args = with_profile[1:]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when both hold options
    try:
        cli = build_cli(args, run=False)
    finally:
        sys.argv = argv
    lit, data = cli.model, cli.datamodule
    if ckpt:
        state = load_tensors(ckpt, f"--ckpt {ckpt}")
        weights = state.get("state_dict", state) if isinstance(state, dict) else None
        if not isinstance(weights, dict):
            raise CliError(f"--ckpt {ckpt}: no state_dict in it")
        if isinstance(state, dict) and "state_dict" in state:  # a Lightning checkpoint
            # as main.py validate: every saved model hyperparameter must be the config's
            check_checkpoint(ckpt, "validate", cli.config.model.as_dict())
        model_weights = {k.removeprefix("model."): v for k, v in weights.items()
                         if k.startswith("model.")}
        try:
            lit.model.load_state_dict(model_weights)
        except RuntimeError as err:
            raise CliError(f"--ckpt {ckpt} does not fit this model: "
                           f"{load_error_reason(err)}") from None
    return lit.model, data


def training_batches(data: Any, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``k`` training batches of ``data`` (its seeded order), inputs and labels."""
    data.setup("fit")
    out = []
    for batch in data.train_dataloader():
        out.append((batch[0], batch[1]))
        if len(out) == k:
            break
    return out


def write_report(rows: list[dict[str, Any]], out: Path, what: str) -> Path:
    """``grad_precision.md`` (a table, ``what`` above it) and ``grad_precision.json``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "grad_precision.json").write_text(json.dumps({"source": what, "rows": rows},
                                                        indent=1) + "\n")
    table = markdown_table(
        ["arm", "one batch", "mean of K", "largest errors of the mean (parameter: error)"],
        [[r["arm"], f"{r['one_batch']:.4f}", f"{r['mean_of_k']:.4f}",
          ", ".join(f"{w['param']}: {w['error']:.3f}" for w in r["worst"])] for r in rows])
    path = out / "grad_precision.md"
    text = "\n".join(["# bf16-mixed gradient against fp32", "", what, "", *table])
    path.write_text(text + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m arbench.bench.grad_precision",
                       description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", required=True,
                    help="a main.py config (repeatable: method config, then profile)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a main.py option, e.g. model.lr=3e-4 or seed_everything=1")
    ap.add_argument("--ckpt", help="weights to load (default: the seed's initialisation)")
    ap.add_argument("--batches", type=int, default=6, help="training batches K (default 6)")
    ap.add_argument("--out", default="results/bench/grad_precision", help="output folder")
    args = ap.parse_args(argv)
    quiet_known_noise()
    if args.batches < 1:
        print("error: --batches must be >= 1", file=sys.stderr)
        return 2
    try:
        model, data = build(args.config, args.set, args.ckpt)
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    batches = training_batches(data, args.batches)
    rows = compare(model, batches)
    what = (f"Model: {' + '.join(args.config)} {' '.join(args.set)}; weights: "
            f"{args.ckpt or 'initialisation'}; K = {len(batches)} training batches of "
            f"{tuple(batches[0][0].shape)} tokens; CPU autocast bf16, "
            f"{torch.get_num_threads()} thread(s).")
    path = write_report(rows, Path(args.out), what)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
