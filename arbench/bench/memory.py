"""Peak memory of one layer call, over what the inputs and weights already hold.

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the
  memory allocated before the call (the caching allocator's own reserve is not counted).
- CPU: tracemalloc does not see torch's allocations, so the resident set size (RSS) is used,
  in a fresh worker process (``python -m arbench.bench.memory``) started with
  ``MALLOC_MMAP_THRESHOLD_=65536``: every block of 64 KiB or more is its own mmap, returned to
  the system when freed, so RSS follows the live tensors instead of glibc's cached heap.
  Per case: ``malloc_trim(0)`` (``gc.collect()`` once per n), read VmRSS, reset the kernel's
  high-water mark (``echo 5 > /proc/self/clear_refs``), run the call once; peak =
  max(VmHWM, VmRSS) after − VmRSS before, at least 0 (VmHWM is updated lazily and can lag the
  current RSS). Every method runs once at a small n first, so one-time buffers
  (thread pools, BLAS workspaces) are not charged to the first case. A probe allocating a known
  64 MiB tensor is reported beside the results as a check of the method. Linux only; elsewhere
  the CPU peaks are NaN.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable

import torch

from arbench.bench.config import BenchConfig, config_from_dict, config_to_dict
from arbench.bench.layers import (
    PASSES,
    build_layer,
    make_call,
    make_inputs,
    method_list,
    skip_reason,
)

MiB = 2.0 ** 20
PROBE_BYTES = 64 * 2 ** 20
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kib(field: str) -> int:
    """A ``VmXXX`` line of ``/proc/self/status`` in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_supported() -> bool:
    """Whether the RSS high-water mark can be read and reset here (Linux)."""
    return os.path.exists(_CLEAR_REFS) and os.access(_CLEAR_REFS, os.W_OK)


def rss_peak_bytes(fn: Callable[[], None]) -> float:
    """Peak RSS growth (bytes) while ``fn`` runs, over the RSS just before it (never < 0).

    The kernel updates VmHWM lazily (when pages are unmapped), so it can read below the current
    VmRSS: the peak is the larger of the two after the call. Tensors are freed by reference
    counting; ``gc.collect`` (slow with torch loaded) is left to the caller."""
    _malloc_trim()
    before = _status_kib("VmRSS")
    with open(_CLEAR_REFS, "w") as fh:
        fh.write("5")
    fn()
    peak = max(_status_kib("VmHWM"), _status_kib("VmRSS"))
    return 1024.0 * max(peak - before, 0)


def cuda_peak_bytes(fn: Callable[[], None], device: str) -> float:
    """Peak CUDA memory allocated while ``fn`` runs, over what was allocated before (bytes)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - before)


def peak_bytes(fn: Callable[[], None], device: str) -> float:
    """Peak memory of ``fn`` on ``device`` (bytes; NaN when it cannot be measured)."""
    if torch.device(device).type == "cuda":
        return cuda_peak_bytes(fn, device)
    return rss_peak_bytes(fn) if rss_supported() else math.nan


def probe_bytes(device: str) -> float:
    """Measured peak of allocating and filling a ``PROBE_BYTES`` tensor (should read ≈ 64 MiB)."""
    return peak_bytes(lambda: torch.ones(PROBE_BYTES // 4, device=device), device)


def measure_all(cfg: BenchConfig, chunk_size: int) -> dict:
    """Peak bytes of every (method, n, pass) of ``cfg`` in this process; plus the probe."""
    methods = [m for m in method_list(cfg) if not m.compiled]  # same memory as eager
    layers = {m.name: build_layer(m, cfg, chunk_size) for m in methods}
    warm = make_inputs(cfg, min(cfg.seq_lens))
    for layer in layers.values():
        for pass_ in PASSES:
            make_call(layer, warm, pass_)()
    del warm
    rows = []
    for n in cfg.seq_lens:
        inputs = make_inputs(cfg, n)
        gc.collect()
        for method in methods:
            for pass_ in PASSES:
                if skip_reason(method, cfg, n, pass_):
                    continue
                peak = peak_bytes(make_call(layers[method.name], inputs, pass_), cfg.device)
                rows.append({"method": method.name, "n": n, "pass": pass_, "peak_bytes": peak})
        del inputs
    return {"rows": rows, "probe_bytes": probe_bytes(cfg.device), "probe_expected": PROBE_BYTES}


def measure_memory(cfg: BenchConfig, chunk_size: int) -> dict:
    """``measure_all`` in a fresh worker process on CPU (see the module docstring), in-process on
    CUDA. Returns ``{"rows": [...], "probe_bytes", "probe_expected", "method": str}``."""
    if torch.device(cfg.device).type == "cuda":
        return {**measure_all(cfg, chunk_size), "method": "torch.cuda.max_memory_allocated"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the worker imports what this process can (a method config's feature map may live in a
    # folder put on sys.path); the interpreter's own folders it finds by itself
    own = (sys.prefix, sys.base_prefix)
    extra = [p for p in sys.path if p and not p.startswith(own)]
    path = os.pathsep.join(dict.fromkeys(p for p in (root, *extra,
                                                     os.environ.get("PYTHONPATH", "")) if p))
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": path}
    request = json.dumps({"config": config_to_dict(cfg), "chunk_size": chunk_size})
    proc = subprocess.run([sys.executable, "-m", "arbench.bench.memory"], input=request,
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "method": "RSS high-water mark in a fresh worker (VmHWM - VmRSS)"}


def _worker() -> None:
    """Read ``{"config", "chunk_size"}`` JSON on stdin, print ``measure_all``'s JSON on stdout."""
    request = json.loads(sys.stdin.read())
    cfg = config_from_dict(request["config"])
    print(json.dumps(measure_all(cfg, int(request["chunk_size"]))))


if __name__ == "__main__":
    _worker()
