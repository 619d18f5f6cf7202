"""Whether two checkouts train the same computation, bit for bit:
``python -m sweeps.same_computation OTHER [--steps 30] [--threads 1] -- FIT_ARGS...``.

A study runs from a worktree at a fixed commit. Before it moves to a newer commit (to pick up a
spec change, say), its runs must train exactly as before, or its old and new runs would be two
computations under one name. This runs ``main.py fit FIT_ARGS`` for ``--steps`` steps in this
checkout and in ``OTHER`` (another checkout, e.g. the study's worktree), each from its own
folder with this Python and ``--threads`` torch threads, one validation batch, into a temporary
folder; then compares the two ``last.ckpt`` weights tensor by tensor. Prints ``bit-identical
(N tensors)`` and exits 0, or names the first tensor that differs (its largest absolute
difference) and exits 1; a run that fails stops with its last line of output (exit 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from arbench.checks import OneLineParser

HERE = Path(__file__).resolve().parents[1]


def fit_args(args: list[str], steps: int, out: Path) -> list[str]:
    """``main.py fit`` with ``args``, ``steps`` training steps, one validation batch at the
    end, logged and checkpointed under ``out``."""
    return ["fit", *args, "--trainer.max_steps", str(steps),
            "--trainer.val_check_interval", str(steps), "--trainer.check_val_every_n_epoch",
            "null", "--trainer.limit_val_batches", "1", "--trainer.logger.init_args.save_dir",
            str(out), "--trainer.logger.init_args.name", "same",
            "--trainer.enable_progress_bar", "false"]


def train(checkout: Path, args: list[str], steps: int, threads: int, out: Path) -> Path:
    """Run ``main.py fit`` in ``checkout``; returns its ``last.ckpt``. ``RuntimeError`` with
    the run's last line of output when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "main.py", *fit_args(args, steps, out)],
                          cwd=checkout, env=env, capture_output=True, text=True)
    last = out / "same" / "checkpoints" / "last.ckpt"
    if done.returncode != 0 or not last.is_file():
        lines = (done.stderr + done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"main.py fit in {checkout} failed: {lines[-1]}")
    return last


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[bool, str]:
    """``(same, message)`` for two state dicts: same keys, and every tensor equal bit for bit."""
    if a.keys() != b.keys():
        only = sorted(set(a) ^ set(b))
        return False, f"different tensors: {', '.join(only[:5])}"
    for key in a:
        x, y = a[key], b[key]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, f"{key}: {tuple(x.shape)} {x.dtype} against {tuple(y.shape)} {y.dtype}"
        if not torch.equal(x, y):
            diff = (x.double() - y.double()).abs().max().item()
            return False, f"{key} differs (largest absolute difference {diff:.3g})"
    return True, f"bit-identical ({len(a)} tensors)"


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint (tensors only)."""
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m sweeps.same_computation",
                       usage="%(prog)s OTHER [--steps N] [--threads N] -- FIT_ARGS...",
                       description=__doc__.split("\n\n")[1],
                       epilog="FIT_ARGS: main.py fit's arguments, after --, e.g. -- --config "
                              "configs/p4.yaml")
    ap.add_argument("other", type=Path, help="the other checkout (its repository root)")
    ap.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    argv = sys.argv[1:] if argv is None else argv
    own = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in own or "--help" in own:
        ap.parse_args(own)  # prints the help and exits 0
    if "--" not in argv:
        ap.error("give main.py fit's arguments after --, e.g. -- --config configs/p4.yaml")
    cut = argv.index("--")
    args, fit = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if not (args.other / "main.py").is_file():
        ap.error(f"{args.other} is not a checkout: it has no main.py")
    if args.steps < 1 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ckpts = [train(root, fit, args.steps, args.threads, Path(tmp) / side)
                     for side, root in (("here", HERE), ("other", args.other.resolve()))]
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        same, message = compare(weights(ckpts[0]), weights(ckpts[1]))
    print(f"{HERE} and {args.other}: {message} after {args.steps} steps")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
