"""The prepared GPU check (``scripts/device_check.sh``): one command, under :data:`BUDGET_S`
seconds (8 minutes) on one modern GPU, everything under ``results/gpu/<device>/``:

1. ``tests``: the CUDA tests (fla backend against arbench's references, the compiled CP
   product), ``tests.log`` and ``tests.xml`` (JUnit);
2. ``bench_fp32``: ``python -m arbench.bench --device cuda`` for LLoPS p = 2 / 4 / 6, BASED and
   softmax (SDPA) at n = 1k … 16k, forward and forward+backward, fp32, with peak memory:
   ``bench/fp32/`` (no fla involved, so a failing fla cannot take these numbers with it);
3. ``bench_bf16``: the same methods again with their bf16 twins (``_bf16``: bf16 autocast, the
   attention through fla): ``bench/bf16/``;
4. ``bench_rest``: Flatten, PolySketch and the gated / delta / gated delta updates on LLoPS
   p = 2's maps, fp32 and bf16: ``bench/rest/``;
5. ``fit``: the ``paper`` profile for BASED and LLoPS p = 4 at lr 1e-3 in bf16-mixed, side by
   side, each stopped after :data:`FIT_TRAIN_TIME` of training: ``fit/<name>.log`` and the
   runs in ``fit/<name>/`` (checkpoints deleted);
6. ``device.json`` (device, versions, each step's command, status and wall time; rewritten
   after every step, so a killed check keeps what ran) and ``summary.md``
   (:mod:`arbench.bench.device_report`).

Each step runs under its own time limit (:data:`STEP_LIMITS_S`); one that fails or runs out is
recorded as such and the next starts. ``--dry-run`` does everything but the device: it checks
the arguments, collects the CUDA tests, parses the bench command lines (method names
included) and prints the merged fit configs (``fit/<name>.config.yaml``), and writes the same
layout, ``device.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from arbench.bench.device_report import write_summary
from arbench.checks import OneLineParser, check_writable
from arbench.files import atomic_write

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 480
STEP_LIMITS_S = {"tests": 80, "bench_fp32": 60, "bench_bf16": 140, "bench_rest": 90, "fit": 90}
"""Wall-clock limit of each step (s); their sum stays under :data:`BUDGET_S` with room for
the device query and the summary."""
FIT_TRAIN_TIME = "00:00:01:00"
"""Lightning ``max_time`` of each fit (training time; start-up and validation come on top)."""
FIT_LR = 1e-3
FIT_CONFIGS = {"based": "configs/based.yaml", "p4": "configs/p4.yaml"}
CUDA_TESTS = ("tests/kernels/test_fla_backend.py", "tests/kernels/test_compiled.py")
SEQ_LENS = ("1024", "2048", "4096", "8192", "16384")
CLAIM_METHODS = ("llops_p2_t1", "llops_p4_t1", "llops_p6_t1", "based_r16", "softmax")
REST_METHODS = ("flatten_p4", "polysketch_p4", "gated_llops_p2_t1", "delta_llops_p2_t1",
                "gated_delta_llops_p2_t1")


@dataclass(frozen=True)
class Command:
    """One process of a step: ``argv`` run in the repo root, its output in ``log``."""

    argv: tuple[str, ...]
    log: str


@dataclass(frozen=True)
class Step:
    """Commands run side by side under one time limit."""

    name: str
    commands: tuple[Command, ...]
    limit_s: int


def slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` → ``"nvidia-h100-80gb-hbm3"`` (a folder name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def bench_argv(python: str, out: Path, methods: tuple[str, ...], bf16: bool) -> tuple[str, ...]:
    """``arbench.bench`` on CUDA for ``methods`` (and their bf16 twins when ``bf16``),
    n = 1k … 16k, memory on, softmax's backward at every n, no training-step measurement (the
    fit step trains)."""
    return (python, "-m", "arbench.bench", "--device", "cuda", "--methods", *methods,
            "--seq-lens", *SEQ_LENS, "--softmax-bwd-max-n", "0", "--repeats", "3",
            "--min-sample-s", "0.02", "--no-train", "--out", str(out), *(["--bf16"] if bf16 else []))


def fit_argv(python: str, config: str, save_dir: Path) -> tuple[str, ...]:
    """``main.py fit``: ``config`` on the ``paper`` profile, lr :data:`FIT_LR`, bf16-mixed,
    :data:`FIT_TRAIN_TIME` of training, runs under ``save_dir``."""
    return (python, "main.py", "fit", "--config", config, "--config", "configs/profiles/paper.yaml",
            "--model.lr", str(FIT_LR), "--trainer.max_time", FIT_TRAIN_TIME,
            "--trainer.precision", "bf16-mixed", "--seed_everything", "0",
            "--trainer.logger.init_args.save_dir", str(save_dir))


def plan(out: Path, python: str = sys.executable) -> list[Step]:
    """The steps of the check, writing under ``out``."""
    tests = (python, "-m", "pytest", "-v", "-rs", *CUDA_TESTS, "-k", "cuda",
             f"--junitxml={out / 'tests.xml'}")
    fits = tuple(Command(fit_argv(python, cfg, out / "fit"), f"fit/{name}.log")
                 for name, cfg in FIT_CONFIGS.items())
    benches = [Step(f"bench_{name}", (Command(bench_argv(python, out / "bench" / name, methods,
                                                        bf16), f"bench/{name}.log"),),
                    STEP_LIMITS_S[f"bench_{name}"])
               for name, methods, bf16 in (("fp32", CLAIM_METHODS, False),
                                           ("bf16", CLAIM_METHODS, True),
                                           ("rest", REST_METHODS, True))]
    return [Step("tests", (Command(tests, "tests.log"),), STEP_LIMITS_S["tests"]), *benches,
            Step("fit", fits, STEP_LIMITS_S["fit"])]


def dry_run_step(step: Step) -> Step:
    """What ``--dry-run`` runs instead of ``step``: pytest only collects; ``main.py fit`` only
    prints its merged config (into ``fit/<name>.config.yaml``). Bench steps run nothing here
    (:func:`check_bench_args` parses them in-process)."""
    if step.name == "tests":
        argv = tuple(a for a in step.commands[0].argv if not a.startswith("--junitxml"))
        return replace(step, commands=(Command((*argv, "--collect-only"),
                                               step.commands[0].log),))
    if step.name == "fit":
        return replace(step, commands=tuple(
            Command((*c.argv, "--print_config"), c.log.replace(".log", ".config.yaml"))
            for c in step.commands))
    return replace(step, commands=())


def check_bench_args(step: Step) -> list[str]:
    """Parse a bench step's command line as ``arbench.bench`` would (flags, method names),
    without its CUDA check; returns the methods it would time."""
    from arbench.bench.__main__ import parser
    from arbench.bench.config import BenchConfig
    from arbench.bench.layers import method_list
    from arbench.options import given

    args = parser().parse_args(list(step.commands[0].argv[3:]))
    cfg = replace(BenchConfig(), **given(args, BenchConfig))
    return [m.name for m in method_list(cfg)]


def run_step(step: Step, out: Path) -> dict:
    """Run the step's commands side by side (each in its own process group, output to its
    log) until all end or ``step.limit_s`` passes (then they are killed). Returns its record."""
    start = time.monotonic()
    procs = []
    for cmd in step.commands:
        log = out / cmd.log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(cmd.argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    codes = []
    for proc in procs:
        left = step.limit_s - (time.monotonic() - start)
        try:
            codes.append(proc.wait(timeout=max(left, 0.1)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            codes.append(None)
    status = ("timed out" if None in codes else
              "ok" if all(c == 0 for c in codes) else f"failed (exit {codes})")
    return {"name": step.name, "status": status, "wall_s": round(time.monotonic() - start, 1),
            "limit_s": step.limit_s, "commands": [asdict(c) for c in step.commands]}


def remove_checkpoints(fit_dir: Path) -> int:
    """Delete the fits' checkpoints (large, not results); returns how many."""
    ckpts = list(fit_dir.rglob("*.ckpt"))
    for path in ckpts:
        path.unlink()
    return len(ckpts)


def device_info(dry_run: bool) -> dict:
    """The GPU's name and the versions that shaped the numbers."""
    from arbench.kernels import fla_backend

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "dry_run": dry_run,
            "commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain")),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if dry_run:
        return {**info, "device": "dry-run (no device)", "fla": "not queried (dry run)"}
    ops = fla_backend.fla_ops()
    return {**info, "device": torch.cuda.get_device_name(0),
            "fla": f"fla {ops.version}" if ops else fla_backend.unavailable_reason()}


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = OneLineParser(prog="scripts/device_check.sh", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="check arguments, test selection, bench and fit command lines and the "
                         "output layout without a GPU")
    ap.add_argument("--out", default=None,
                    help="output folder (default: results/gpu/<device>, results/gpu/dry-run "
                         "for --dry-run)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run (or dry-run) the check; returns the exit status (0: every step ok)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device here (torch.cuda.is_available() is False); "
              "--dry-run checks the plan without one", file=sys.stderr)
        return 2
    info = device_info(args.dry_run)
    out = Path(args.out) if args.out else ROOT / "results" / "gpu" / slug(
        "dry-run" if args.dry_run else info["device"])
    try:
        check_writable(out, "--out")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    record = {**info, "out": str(out), "budget_s": BUDGET_S, "steps": []}
    try:
        for step in plan(out):
            print(f"[device check] {step.name} (limit {step.limit_s} s)", flush=True)
            if args.dry_run:
                for cmd in step.commands:  # the layout the real run writes into
                    (out / cmd.log).parent.mkdir(parents=True, exist_ok=True)
                done = run_step(dry_run_step(step), out)
                if step.name.startswith("bench"):
                    try:
                        done["methods"] = check_bench_args(step)
                    except (ValueError, SystemExit) as err:  # argparse exits on a bad flag
                        done["status"] = f"failed ({err or 'bad arguments'})"
                done["would_run"] = [asdict(c) for c in step.commands]
            else:
                done = run_step(step, out)
            if step.name == "fit":
                done["checkpoints_removed"] = remove_checkpoints(out / "fit")
            record["steps"].append(done)
            print(f"[device check] {step.name}: {done['status']} in {done['wall_s']} s", flush=True)
            _write_record(out, record)
    finally:
        record["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        _write_record(out, record)
        write_summary(out, record)
    print(f"[device check] wrote {out}/summary.md and device.json", flush=True)
    return 0 if all(s["status"] == "ok" for s in record["steps"]) else 1


def _write_record(out: Path, record: dict) -> None:
    atomic_write(out / "device.json", lambda tmp: tmp.write_text(json.dumps(record, indent=1)))


if __name__ == "__main__":
    raise SystemExit(main())
