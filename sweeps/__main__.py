"""The command line, ``python -m sweeps``: one command per call, each error one line.

``python -m sweeps run SPEC [SPEC ...] [--profile P] [--size S] [--storage URL] [--workers N]
[--trials N] [--until HH:MM] [--retry-failed] [--widen N]``, ``python -m sweeps report SPEC``,
``python -m sweeps suite SPEC [SPEC ...] [--out results/suite]`` (one grid over several tasks,
:mod:`sweeps.report.suite`), ``python -m sweeps status``, ``python -m sweeps save|restore
ARCHIVE`` (:mod:`sweeps.archive`). ``report`` and ``suite`` read each study at the profile
and size it ran at (a ``--profile``/``--size`` naming others stops), and never write a report
of no finished run over an existing ``table.md``.

Every error the user can cause (bad spec, unreachable storage, rejected grid value, unwritable
``--runs``, a study that never ran) prints one line ``error: ...`` and exits with status 2,
before anything is written. A sweep that ends with failed points exits with status 1 and
names the first failure; ``--retry-failed`` queues those points again. A storage that stops
answering mid-command (a database restart, a lock held too long) prints one line and exits
with status 3 (:mod:`sweeps.faults`); rerunning the command resumes. A database that refuses a
request (a missing privilege, a value its column cannot hold) prints one line and exits with
status 2. The storage URL may come from ``$ARBENCH_STORAGE`` or ``--storage-file``, and is shown
with its password masked (:mod:`sweeps.secrets`).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from arbench.checks import CliError, OneLineParser, check_writable
from arbench.noise import quiet_lightning_loggers, quiet_sweep_noise
from sweeps.archive import check_not_half_restored, restore, save
from sweeps.command import validate_points
from sweeps.faults import STORAGE_LOST_STATUS, fault_reason, storage_fault, storage_lost_message
from sweeps.runtime import parse_until
from sweeps.secrets import ENV_VAR, argv_without_storage, given_storage, password, scrub, worker_env
from sweeps.spec import ROOT, SpecError, SweepSpec, load_spec
from sweeps.status import count_states, status_lines
from sweeps.storage import StorageError, open_storage
from sweeps.study import ran_at
from sweeps.trials import RESULTS, failed_points

DESCRIPTION = ("Optuna sweeps of main.py: run (or resume) a spec's grid, report its tables and "
               "plots, list the studies' trial counts.")


def _die_with_parent() -> None:
    """Child workers get SIGKILL when the parent dies (Linux), so no orphan keeps training."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def profile_names() -> str:
    """The profiles ``--profile`` may name: the stems of ``configs/profiles/*.yaml``."""
    return " | ".join(sorted(p.stem for p in (ROOT / "configs" / "profiles").glob("*.yaml")))


def positive_int(text: str) -> int:
    """An option's value as a positive integer; else argparse's one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _storage_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--storage", help=f"Optuna RDB URL (default: ${ENV_VAR}, else the spec's "
                                      "storage:, else sqlite:///runs/sweeps.db); a URL with a "
                                      f"password is better given by --storage-file or "
                                      f"${ENV_VAR}, which the process list does not show")
    ap.add_argument("--storage-file", metavar="PATH",
                    help="a file whose first line is the storage URL")
    ap.add_argument("--lock-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="SQLite: seconds to wait for another process's write lock before "
                         "stopping (default 120)")
    ap.add_argument("--heartbeat", type=int, default=30, help="seconds between heartbeats")
    ap.add_argument("--grace", type=int, default=120,
                    help="seconds without heartbeat before a running trial counts as dead")


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m sweeps", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a sweep")
    run.add_argument("spec", nargs="+", help="one spec, or several to run one after another")
    run.add_argument("--profile", help=f"a name in configs/profiles/: {profile_names()} "
                                       "(default: the spec's)")
    run.add_argument("--size", help="a model size of configs/sizes/, e.g. tiny (default: the "
                                    "spec's, else the model's default size)")
    run.add_argument("--workers", type=int, default=1, help="worker processes on this machine")
    run.add_argument("--trials", type=positive_int,
                     help="stop each worker after this many trials")
    run.add_argument("--until", metavar="WHEN",
                     help="start only the queued runs expected to end by then (HH:MM, +90m, "
                          "+1h30m or an ISO date and time; each run timed by the study's "
                          "nearest finished runs), then stop: a machine lent until a known time "
                          "leaves no half-trained run behind")
    run.add_argument("--runs", default="runs", help="root folder of the trials' runs")
    run.add_argument("--threads", type=positive_int,
                     help="torch threads per worker (default: $OMP_NUM_THREADS where set, "
                          "else the cores over --workers)")
    run.add_argument("--retry-failed", action="store_true",
                     help="queue the grid points whose trials failed again")
    run.add_argument("--widen", type=int, default=0, metavar="N",
                     help="when a point's best lr is the lowest (highest) tried, run one more "
                          "lr beyond it, up to N beyond the spec's lrs on each side "
                          "(sweeps.widen; default 0: off)")
    _storage_args(run)
    rep = sub.add_parser("report", help="tables and plots of a sweep under results/<study>/")
    rep.add_argument("spec")
    rep.add_argument("--profile", help="a name in configs/profiles/ (default: the profile the "
                                       "study ran at; another one stops)")
    rep.add_argument("--size", help="a model size of configs/sizes/ (default: the size the "
                                    "study ran at; another one stops)")
    rep.add_argument("--out", default="results",
                     help="folder the report goes under, as <out>/<study>/ (default results)")
    _storage_args(rep)
    su = sub.add_parser("suite", help="one grid over several tasks (a spec each): the method × "
                                      "task table with MAD's aggregate, and its heat map")
    su.add_argument("spec", nargs="+", help="a spec per task, all with the same grid")
    su.add_argument("--profile", help="a name in configs/profiles/ every study must have run "
                                      "at (default: the profile each study ran at)")
    su.add_argument("--size", help="a model size of configs/sizes/ every study must have run at "
                                   "(default: the size each study ran at)")
    su.add_argument("--out", default="results/suite",
                    help="folder of table.md, table.csv, heatmap.png (default results/suite)")
    _storage_args(su)
    st = sub.add_parser("status", help="list studies with their trial counts")
    _storage_args(st)
    sv = sub.add_parser("save", help="write the storage's studies to an archive file (JSON "
                                     "Lines) to commit; the file's other studies are kept")
    sv.add_argument("archive")
    sv.add_argument("--replace", action="append", default=[], metavar="STUDY",
                    help="save STUDY even though the archive holds finished runs of it that the "
                         "storage lacks (they are dropped); repeatable")
    _storage_args(sv)
    rs = sub.add_parser("restore", help="add an archive's studies to the storage (those it "
                                        "lacks), so their sweeps resume on a new machine")
    rs.add_argument("archive")
    _storage_args(rs)
    return ap


def open_command_storage(args: argparse.Namespace, url: str | None,
                         must_exist: bool = False) -> RDBStorage:
    """:func:`open_storage` with the command's storage options; ``url`` is kept in
    ``args.urls`` so that an error line masks its password too (a spec's ``storage:``
    included)."""
    if url:
        args.urls = [*getattr(args, "urls", []), url]
    return open_storage(url, args.heartbeat, args.grace, must_exist=must_exist,
                        lock_timeout=args.lock_timeout)


def cmd_run(args: argparse.Namespace) -> int:
    """Run each spec's sweep in turn. Every spec is loaded and checked before the first
    runs, so a bad one fails at the start rather than hours later; a sweep that ends with
    failed points does not stop the next. Worker processes (``--workers``) are started for
    one spec at a time (``ARBENCH_SWEEP_SPEC`` names which)."""
    from arbench.kernels import keep_heap  # here: keeps torch out of CLI start-up

    quiet_lightning_loggers()
    keep_heap()
    if args.workers < 1:
        raise SpecError("--workers must be >= 1")
    check_writable(args.runs, "--runs")
    only = os.environ.get("ARBENCH_SWEEP_SPEC")
    indices = [int(only)] if only is not None else list(range(len(args.spec)))
    specs = [load_spec(args.spec[i], args.profile, args.size) for i in indices]
    if args.widen < 0:
        raise SpecError("--widen needs N >= 0")
    until = parse_until(args.until).timestamp() if args.until else None
    for spec in specs:
        if (args.retry_failed or args.widen) and spec.sampler != "grid":
            raise SpecError(f"{spec.study}: --retry-failed and --widen need a grid sweep "
                            "(sampler: grid)")
    # checked where every named spec is loaded: a worker of one spec sees only that spec
    if args.widen and only is None and not any(len(spec.lr) >= 2 for spec in specs):
        raise SpecError("--widen needs a spec with an lr sub-grid of at least 2 lrs")
    studies = [spec.study for spec in specs]
    if len(set(studies)) < len(studies):
        raise SpecError(f"a study is named twice in {', '.join(studies)}")
    if os.environ.get("ARBENCH_SWEEP_WORKER") is None:
        for spec in specs:
            validate_points(spec)
    given = given_storage(args.storage, args.storage_file)
    urls = [given or spec.storage for spec in specs]
    storages = [open_command_storage(args, url) for url in urls]
    return max(run_spec(spec, storage, args, i, url, until)
               for i, spec, storage, url in zip(indices, specs, storages, urls))


def start_workers(args: argparse.Namespace, index: int, url: str | None,
                  until: float | None = None) -> list:
    """The ``--workers`` - 1 other worker processes of spec ``index``: this command's
    arguments (``args.argv``, as :func:`main` got them) less the storage options, the storage
    URL in ``$ARBENCH_STORAGE`` (:mod:`sweeps.secrets`), so no process list shows it. A
    deadline goes last as the date and time it stands for, so ``--until +90m`` means the same
    moment to a spec whose workers start hours later."""
    argv = argv_without_storage(args.argv)
    if until is not None:  # the last --until given wins
        argv += ["--until", datetime.datetime.fromtimestamp(until).isoformat(timespec="seconds")]
    children = []
    for i in range(1, args.workers):
        env = {**worker_env(dict(os.environ), url), "ARBENCH_SWEEP_WORKER": f"w{i}",
               "ARBENCH_SWEEP_SPEC": str(index)}
        children.append(subprocess.Popen([sys.executable, "-m", "sweeps", *argv],
                                         env=env, preexec_fn=_die_with_parent))
    return children


def worker_threads(given: int | None, workers: int) -> int:
    """torch threads per worker: ``--threads``, else a positive ``$OMP_NUM_THREADS``, else the
    cores over ``workers``."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if given:
        return given
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // workers)


def run_spec(spec, storage, args: argparse.Namespace, index: int, url: str | None = None,
             until: float | None = None) -> int:
    """Run one spec's sweep (in the parent: queue its grid, start the other workers, widen);
    returns the exit status. ``url``: the storage's URL, handed to the workers; ``until``:
    ``--until`` as epoch seconds."""
    # here: keeps torch and Lightning out of the other commands' start-up
    import torch

    from sweeps.queue import enqueue_grid
    from sweeps.study import make_study
    from sweeps.widen import widen
    from sweeps.worker import work

    check_not_half_restored(storage, [spec.study])
    worker_id = os.environ.get("ARBENCH_SWEEP_WORKER")
    threads = worker_threads(args.threads, args.workers)
    torch.set_num_threads(threads)
    if worker_id is None:
        study = make_study(spec, storage)
        queued, requeued = enqueue_grid(study, spec, storage, args.retry_failed) \
            if spec.sampler == "grid" else (0, 0)
        again = f", {requeued} failed queued again" if args.retry_failed else ""
        print(f"[{time.strftime('%F %T')}] study {spec.study} (profile {spec.profile}): "
              f"{len(spec.points())} grid points, {queued} newly queued{again}; "
              f"{args.workers} worker(s), {threads} thread(s) each" + (
                  "; starting only runs expected to end by "
                  f"{datetime.datetime.fromtimestamp(until):%Y-%m-%d %H:%M}" if until else ""),
              flush=True)
    ran, codes = 0, []
    while True:
        children = start_workers(args, index, url, until) \
            if worker_id is None and args.workers > 1 else []
        try:
            ran += work(spec, storage, Path(args.runs), worker_id or "w0",
                        max_trials=args.trials, until=until)
        finally:  # the workers report a lost storage themselves; never orphan them
            codes += [c.wait() for c in children]
        if worker_id is not None or not args.widen or args.trials:
            break
        if len(spec.lr) < 2:
            print(f"{spec.study}: no lr sub-grid of 2 or more lrs (its grid sets each lr), so "
                  "--widen does not apply to it", flush=True)
            break
        added = widen(spec, storage, args.widen)
        if not added:
            break
        lrs = sorted({p["model.lr"] for p in added})
        print(f"widening: {len(added)} run(s) at lr {', '.join(f'{x:g}' for x in lrs)} "
              f"where a point's best lr was at an edge", flush=True)
    if worker_id is None:
        counts = count_states(spec.study, storage)
        print(f"[{time.strftime('%F %T')}] study {spec.study}: " +
              ", ".join(f"{k} {v}" for k, v in counts.items()) +
              f" (this process ran {ran})", flush=True)
        if report_failures(spec.study, storage, grid=spec.sampler == "grid"):
            return max([1, *codes])
    return max(codes, default=0)


def report_failures(study_name: str, storage, grid: bool) -> bool:
    """Print one ``error:`` line if points of the study ended failed; True if any did."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    failed = failed_points(study.get_trials(deepcopy=False))
    if not failed:
        return False
    first = failed[0]
    reason = first.user_attrs.get("fail_reason") or "no reason recorded"
    name = first.user_attrs.get("run_name", f"trial {first.number}")
    what, hint = ("grid point(s)", " and rerun with --retry-failed") if grid else ("trial(s)", "")
    print(f"error: {len(failed)} {what} failed, e.g. {name}: {reason}; fix the cause{hint}",
          file=sys.stderr, flush=True)
    return True


def _at(profile: str | None, size: str | None) -> str:
    """``profile P, size S`` as a message names them."""
    return f"profile {profile}" + (f", size {size}" if size else "")


def spec_as_ran(path: str, args: argparse.Namespace, storage: RDBStorage,
                known: set[str]) -> SweepSpec:
    """The spec at ``path`` read at the profile and size its study ran at (the study's user
    attrs, as :func:`sweeps.study.check_same_profile` reads them), so a report shows its runs
    under their own profile; a ``--profile`` or ``--size`` given must match them, else
    :class:`SpecError` in one line. A study not in ``known`` (not run): the spec as given."""
    spec = load_spec(path, args.profile, args.size)
    if spec.study not in known:
        return spec
    attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(spec.study))
    profile, size = ran_at(attrs, spec)
    if (args.profile is not None and args.profile != profile) or \
            (args.size is not None and args.size != size):
        asked = " ".join(f"--{k} {v}" for k, v in (("profile", args.profile),
                                                   ("size", args.size)) if v is not None)
        raise SpecError(f"study {spec.study} ran at {_at(profile, size)}, not what {asked} "
                        "asks for: leave out --profile and --size to report it as it ran, or "
                        "give the --storage of the runs you mean")
    if (profile, size) == (spec.profile, spec.size):
        return spec
    ran = load_spec(path, profile, size)
    if size is None:  # recorded as the model's default size, whatever the spec says now
        ran = dataclasses.replace(ran, size=None)
    if ran.study != spec.study:
        raise SpecError(f"{path} names study {ran.study} at {_at(profile, size)}, the profile "
                        f"and size its study {spec.study} ran at: give --profile and --size")
    return ran


def has_results(storage: RDBStorage, study: str) -> bool:
    """Whether ``study`` has a finished run holding a result (complete or pruned)."""
    study_id = storage.get_study_id_from_name(study)
    return bool(storage.get_all_trials(study_id, deepcopy=False, states=RESULTS))


def check_not_emptied(table: Path, what: str) -> None:
    """Stop in one line rather than write a report of no finished run over ``table``."""
    if table.exists():
        raise CliError(f"{what} no finished run yet: not writing an empty report over {table} "
                       "(run it first, or give another --out)")


def check_same_report(table: Path, spec) -> None:
    """Stop in one line rather than write a report at ``spec``'s profile over ``table``, a
    report of the study at another profile (e.g. a smoke run's over the committed one)."""
    if not table.exists():
        return
    with table.open() as fh:
        title = fh.readline().strip()
    prefix = f"# {spec.study} ("
    if title.startswith(prefix) and title.endswith(" profile)"):
        theirs = title[len(prefix):-len(" profile)")]
        if theirs != spec.profile:
            raise CliError(f"{table} is the report of study {spec.study} at profile {theirs}; "
                           f"this storage's ran at profile {spec.profile}: not writing over "
                           "it (give another --out)")


def cmd_report(args: argparse.Namespace) -> int:
    """A study's tables and plots under ``--out``/<study>/, at the profile and size it ran at
    (:func:`spec_as_ran`)."""
    from sweeps.report import write_report  # here: keeps torch out of CLI start-up

    spec = load_spec(args.spec, args.profile, args.size)
    check_writable(args.out, "--out")
    storage = open_command_storage(args, given_storage(args.storage, args.storage_file)
                                   or spec.storage, must_exist=True)
    known = set(optuna.get_all_study_names(storage))
    if spec.study not in known:
        raise StorageError(f"study {spec.study} has not run in this storage: nothing to report "
                           f"(start it with `python -m sweeps run {args.spec}`)")
    spec = spec_as_ran(args.spec, args, storage, known)
    if not has_results(storage, spec.study):
        check_not_emptied(Path(args.out) / spec.study / "table.md", f"study {spec.study} has")
    check_same_report(Path(args.out) / spec.study / "table.md", spec)
    for path in write_report(spec, storage, Path(args.out)):
        print(path)
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    """The suite's table and heat map (:mod:`sweeps.report.suite`); each spec's study may be
    unfinished or not started, but one of them must have run. Each spec is read at the profile
    and size its study ran at (:func:`spec_as_ran`)."""
    from sweeps.report.suite import check_suite, write_suite  # here: keeps torch out of start-up

    specs = [load_spec(path, args.profile, args.size) for path in args.spec]
    check_suite(specs)
    check_writable(args.out, "--out")
    storage = open_command_storage(args, given_storage(args.storage, args.storage_file)
                                   or specs[0].storage, must_exist=True)
    known = set(optuna.get_all_study_names(storage))
    if not known & {spec.study for spec in specs}:
        raise StorageError(f"none of the suite's studies ({', '.join(s.study for s in specs)}) "
                           "has run in this storage: nothing to report (start one with "
                           f"`python -m sweeps run {args.spec[0]}`)")
    ran = {i: spec_as_ran(path, args, storage, known)
           for i, path in enumerate(args.spec) if specs[i].study in known}
    first = ran[min(ran)]  # a study not run yet: the profile and size the first one ran at,
    default = specs[min(ran)]  # where that is no spec's own (a smoke suite stays smoke)
    profile = args.profile or (first.profile if first.profile != default.profile else None)
    size = args.size or (first.size if first.size != default.size else None)
    specs = [ran[i] if i in ran else load_spec(path, profile, size)
             for i, path in enumerate(args.spec)]
    check_suite(specs)
    if not any(has_results(storage, spec.study) for spec in specs if spec.study in known):
        check_not_emptied(Path(args.out) / "table.md", "the suite's studies have")
    for path in write_suite(specs, storage, Path(args.out)):
        print(path)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    storage = open_command_storage(args, given_storage(args.storage, args.storage_file),
                                   must_exist=True)
    check_not_half_restored(storage)
    for line in status_lines(storage):
        print(line)
    return 0


def cmd_save(args: argparse.Namespace) -> int:
    storage = open_command_storage(args, given_storage(args.storage, args.storage_file),
                                   must_exist=True)
    check_writable(str(Path(args.archive).parent), "archive folder")
    for name, n in save(storage, Path(args.archive), replace=args.replace).items():
        print(f"saved {name}: {n} trial(s)")
    print(args.archive)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    storage = open_command_storage(args, given_storage(args.storage, args.storage_file))
    added, skipped = restore(Path(args.archive), storage)
    for name, n in added.items():
        print(f"restored {name}: {n} trial(s)")
    for name in skipped:
        print(f"kept {name}: the storage already has it (not restored)")
    return 0


def secret_url(args: argparse.Namespace) -> str | None:
    """The storage URL the user gave (to mask in messages), or None if it cannot be read."""
    try:
        return given_storage(args.storage, args.storage_file)
    except CliError:
        return None


def scrub_urls(message: str, args: argparse.Namespace) -> str:
    """``message`` with the passwords of the URL the user gave and of every storage the
    command opened replaced by ``***`` (:func:`sweeps.secrets.scrub`)."""
    for url in [secret_url(args), *getattr(args, "urls", [])]:
        message = scrub(message, url)
    return message


def database_error(err: BaseException) -> BaseException | None:
    """The database error ``err`` is, or was raised from (a ``DBAPIError``, or Optuna's
    ``StorageInternalError`` wrapping one: a rejected statement, a missing privilege, a value
    the column cannot hold), or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (StorageInternalError, DBAPIError)):
            return current
        current = current.__cause__
    return None


def database_error_message(err: BaseException) -> str:
    """One line for a database error that is no lost connection: the driver's first line."""
    cause = err.__cause__ if isinstance(err, StorageInternalError) else None
    reason = fault_reason(cause if isinstance(cause, SQLAlchemyError) else err)
    return f"the storage refused a request: {reason}"


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: this process's arguments); returns the exit status.
    Worker processes started by ``run`` get ``argv``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    quiet_sweep_noise()
    args.urls = []
    if password(args.storage) and os.environ.get("ARBENCH_SWEEP_WORKER") is None:
        print(f"note: --storage shows its password to every user of this machine (the process "
              f"list); give the URL in ${ENV_VAR} or --storage-file instead", file=sys.stderr)
    try:
        if not (math.isfinite(args.lock_timeout) and args.lock_timeout > 0):
            raise CliError(f"--lock-timeout must be a positive number of seconds, got "
                           f"{args.lock_timeout}")
        commands = {"run": cmd_run, "report": cmd_report, "suite": cmd_suite,
                    "status": cmd_status,
                    "save": cmd_save, "restore": cmd_restore}
        return commands[args.command](args)
    except Exception as err:
        worker = os.environ.get("ARBENCH_SWEEP_WORKER")
        fault = storage_fault(err)
        # a worker's storage answered its parent a moment ago: failing to open it is a loss
        if fault is not None and (worker or not isinstance(err, StorageError)):
            message, status = storage_lost_message(fault, worker), STORAGE_LOST_STATUS
        elif isinstance(err, (SpecError, StorageError, CliError)):
            message, status = str(err), 2
        elif database_error(err) is not None:
            message, status = database_error_message(database_error(err)), 2
        else:
            raise
        print(f"error: {scrub_urls(message, args)}", file=sys.stderr, flush=True)
        return status


if __name__ == "__main__":
    sys.exit(main())
