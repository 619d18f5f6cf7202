"""``python -m sweeps run SPEC [--profile P] [--storage URL] [--workers N] [--trials N]``,
``python -m sweeps report SPEC``, ``python -m sweeps status``.

Every error the user can cause (bad spec, unreachable storage, rejected grid value) prints one
line ``error: ...`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from sweeps.spec import SpecError, load_spec
from sweeps.storage import StorageError, open_storage


def _die_with_parent() -> None:
    """Child workers get SIGKILL when the parent dies (Linux), so no orphan keeps training."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _storage_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--storage", help="Optuna RDB URL (default sqlite:///runs/sweeps.db)")
    ap.add_argument("--heartbeat", type=int, default=30, help="seconds between heartbeats")
    ap.add_argument("--grace", type=int, default=120,
                    help="seconds without heartbeat before a running trial counts as dead")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sweeps", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a sweep")
    run.add_argument("spec")
    run.add_argument("--profile", help="smoke | cpu | paper (default: the spec's)")
    run.add_argument("--workers", type=int, default=1, help="worker processes on this machine")
    run.add_argument("--trials", type=int, help="stop each worker after this many trials")
    run.add_argument("--runs", default="runs", help="root folder of the trials' runs")
    run.add_argument("--threads", type=int, help="torch threads per worker")
    _storage_args(run)
    rep = sub.add_parser("report", help="tables and plots of a sweep under results/<study>/")
    rep.add_argument("spec")
    rep.add_argument("--profile")
    rep.add_argument("--out", default="results")
    _storage_args(rep)
    st = sub.add_parser("status", help="list studies with their trial counts")
    _storage_args(st)
    return ap


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    from arbench.allocator import keep_heap
    from sweeps.worker import enqueue_grid, make_study, quiet_libraries, validate_points, work

    quiet_libraries()
    keep_heap()
    if args.workers < 1:
        raise SpecError("--workers must be >= 1")
    spec = load_spec(args.spec, args.profile)
    storage = open_storage(args.storage or spec.storage, args.heartbeat, args.grace)
    worker_id = os.environ.get("ARBENCH_SWEEP_WORKER")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    torch.set_num_threads(threads)
    if worker_id is None:
        validate_points(spec)
        study = make_study(spec, storage)
        queued = enqueue_grid(study, spec, storage) if spec.sampler == "grid" else 0
        print(f"study {spec.study} (profile {spec.profile}): {len(spec.points())} grid points, "
              f"{queued} newly queued; {args.workers} worker(s), {threads} thread(s) each",
              flush=True)
    children = []
    if worker_id is None and args.workers > 1:
        for i in range(1, args.workers):
            env = {**os.environ, "ARBENCH_SWEEP_WORKER": f"w{i}"}
            children.append(subprocess.Popen([sys.executable, "-m", "sweeps", *sys.argv[1:]],
                                              env=env, preexec_fn=_die_with_parent))
    ran = work(spec, storage, Path(args.runs), worker_id or "w0", max_trials=args.trials)
    codes = [c.wait() for c in children]
    if worker_id is None:
        from sweeps.report import count_states

        counts = count_states(spec.study, storage)
        print(f"study {spec.study}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
              f" (this process ran {ran})", flush=True)
    return max(codes, default=0)


def cmd_report(args: argparse.Namespace) -> int:
    from sweeps.report import write_report

    spec = load_spec(args.spec, args.profile)
    storage = open_storage(args.storage or spec.storage, args.heartbeat, args.grace)
    for path in write_report(spec, storage, Path(args.out)):
        print(path)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from sweeps.report import status_lines

    storage = open_storage(args.storage, args.heartbeat, args.grace)
    for line in status_lines(storage):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"run": cmd_run, "report": cmd_report, "status": cmd_status}[args.command](args)
    except (SpecError, StorageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
