"""One benchmark run: matmul reference, chunk tuning, form check, layer timings, memory,
training throughput, target checks; then the files ``bench.csv``, ``bench.md``,
``bench.json``, ``train.csv`` and ``bench.png`` in ``cfg.out_dir``."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from arbench.bench.config import BenchConfig, config_to_dict
from arbench.bench.layers import (
    PASSES,
    Method,
    attention_backend,
    build_layer,
    compiled_disagreement,
    forms_disagreement,
    layer_flops,
    make_call,
    make_inputs,
    method_list,
    skip_reason,
)
from arbench.bench.memory import MiB, measure_memory
from arbench.bench.report import write_outputs
from arbench.bench.targets import target_checks
from arbench.bench.timing import (
    Case,
    case_throughput,
    matmul_case,
    matmul_throughput,
    round_robin,
    summary,
    warm_up,
)
from arbench.bench.training import measure_training
from arbench.kernels import block_rows, cp_block_rows, fla_backend, keep_heap
from arbench.machine import cpu_name
from arbench.precision import native_bf16

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def tuning_method(methods: list[Method]) -> Method | None:
    """LLoPS p=4, t=1 when benchmarked, else the first linear method (None without any)."""
    linear = [m for m in methods if m.linear]
    preferred = [m for m in linear if m.family == "llops" and m.p == 4 and m.rank == 1]
    return (preferred or linear or [None])[0]


def _interleaved_medians(cfg: BenchConfig, cases: list[Case]) -> dict:
    """Warm every case up, time them in interleaved rounds (at least 3); median s per key."""
    for case in cases:
        warm_up(case, cfg.device, cfg.min_sample_s)
    round_robin([cases], max(cfg.repeats, 3), cfg.device)
    return {case.key: summary(case.samples)["median"] for case in cases}


def chunk_tuning_methods(methods: list[Method]) -> list[Method]:
    """The :func:`tuning_method` and BASED when benchmarked: the two feature widths (m and
    1 + r + r²) whose attention the chunk size shapes. For LLoPS alone the feature map's time
    dominates and two chunk sizes can differ by less than the noise."""
    first = tuning_method([m for m in methods if not m.derived])
    if first is None:
        return []
    based = [m for m in methods if m.family == "based" and not m.derived and m is not first]
    return [first, *based[:1]]


def _tune(cfg: BenchConfig, tuned: list[Method], values: tuple[int, ...], key: str,
          wrap: Callable[[torch.nn.Module, int, Callable[[], None]], Callable[[], None]],
          label: str, log: Log) -> dict:
    """Time each of ``values`` at ``cfg.tune_n`` tokens on the ``tuned`` methods (forward and
    forward+backward, interleaved; ``wrap(layer, value, call)`` runs a call with the value set);
    choose the one with the smallest sum of forward+backward medians. Table rows name the value
    ``key``."""
    inputs = make_inputs(cfg, cfg.tune_n)
    cases = []
    for method in tuned:
        layer = build_layer(method, cfg, cfg.chunk_sizes[0])
        for value in values:
            for pass_ in PASSES:
                call = wrap(layer, value, make_call(layer, inputs, pass_))
                cases.append(Case((method.name, value, pass_), call))
    med = _interleaved_medians(cfg, cases)
    table = [{"method": m.name, key: v, "fwd_ms": 1e3 * med[(m.name, v, "fwd")],
              "fwd_bwd_ms": 1e3 * med[(m.name, v, "fwd_bwd")]} for m in tuned for v in values]
    chosen = min(values, key=lambda v: sum(med[(m.name, v, "fwd_bwd")] for m in tuned))
    names = " + ".join(m.name for m in tuned)
    log(f"{label}: {chosen} (fastest forward+backward of {names} at n={cfg.tune_n})")
    return {"chosen": chosen, "methods": [m.name for m in tuned], "n": cfg.tune_n,
            "table": table}


def tune_chunk_size(cfg: BenchConfig, methods: list[Method], log: Log) -> dict:
    """:func:`_tune` over ``cfg.chunk_sizes`` on the :func:`chunk_tuning_methods`."""
    tuned = chunk_tuning_methods(methods)
    if len(cfg.chunk_sizes) == 1 or not tuned:
        return {"chosen": cfg.chunk_sizes[0], "methods": [], "n": None, "table": []}
    return _tune(cfg, tuned, cfg.chunk_sizes, "chunk", _with_chunk, "chunk size", log)


def block_tuning_methods(methods: list[Method]) -> list[Method]:
    """LLoPS p=4, t=1 and the LLoPS layer with the most factors p·t (the widest projections)."""
    llops = [m for m in methods if m.family == "llops" and not m.derived]
    if not llops:
        return []
    widest = max(llops, key=lambda m: m.p * m.rank)
    first = tuning_method(llops)
    return [first] if first is widest else [first, widest]


def tune_cp_block_rows(cfg: BenchConfig, methods: list[Method], log: Log) -> dict:
    """:func:`_tune` over ``cfg.cp_block_rows`` on the :func:`block_tuning_methods`. On a GPU
    the feature maps are not blocked and nothing is tuned."""
    tuned = block_tuning_methods(methods)
    if len(cfg.cp_block_rows) == 1 or not tuned or torch.device(cfg.device).type != "cpu":
        return {"chosen": cfg.cp_block_rows[0], "methods": [], "n": None, "table": []}
    return _tune(cfg, tuned, cfg.cp_block_rows, "rows", _with_block_rows, "cp block rows", log)


def _with_block_rows(layer: torch.nn.Module, rows: int,
                     call: Callable[[], None]) -> Callable[[], None]:
    """``call`` with ``cp_block_rows(rows)`` for its duration (``layer``: unused, the signature
    of :func:`_tune`'s ``wrap``)."""
    def run() -> None:
        with cp_block_rows(rows, low_precision=block_rows(torch.bfloat16)):
            call()
    return run


def _with_chunk(layer: torch.nn.Module, chunk: int, call: Callable[[], None]) -> Callable[[], None]:
    """``call`` with ``layer.chunk_size`` set to ``chunk`` for its duration."""
    def run() -> None:
        layer.chunk_size = chunk
        call()
    return run


def check_forms(cfg: BenchConfig, layers: dict[str, torch.nn.Module], methods: list[Method],
                chunk: int) -> list[dict]:
    """Chunked vs quadratic output of every linear layer, at a length spanning two and a half
    chunks (so the carried state and the padding are exercised), at least ``cfg.check_n``."""
    n = max(cfg.check_n, 2 * chunk + chunk // 2 + 1)
    inputs = make_inputs(cfg, n)
    return [{"method": m.name, "n": n, "chunk": layers[m.name].chunk_size,
             "rel_err": forms_disagreement(layers[m.name], inputs)}
            for m in methods if m.linear and not m.derived]


def check_twins(cfg: BenchConfig, layers: dict[str, torch.nn.Module], methods: list[Method],
                suffix: str) -> list[dict]:
    """Forward output of every ``<name><suffix>`` twin (``_compiled``, ``_bf16``) against the
    eager fp32 layer of the same weights, at the smallest benchmarked n (a shape the timings
    compile anyway)."""
    n = min(cfg.seq_lens)
    inputs = make_inputs(cfg, n)
    return [{"method": m.name, "n": n, "rel_err": compiled_disagreement(
                layers[m.name], layers[m.name.removesuffix(suffix)], inputs)}
            for m in methods if m.name.endswith(suffix) and m.derived]


def time_layers(cfg: BenchConfig, layers: dict[str, torch.nn.Module], methods: list[Method],
                log: Log, references: Sequence[Case] = ()) -> dict[tuple[str, int, str], Case]:
    """Warm up, then time every (method, n, pass): ``cfg.repeats`` interleaved rounds; the
    ``references`` (:func:`~arbench.bench.timing.matmul_case`) run once in every round too,
    as a group of their own."""
    groups = []
    if references:
        for case in references:
            warm_up(case, cfg.device, cfg.min_sample_s)
        groups.append(list(references))
    for n in cfg.seq_lens:
        inputs = make_inputs(cfg, n)
        for pass_ in PASSES:
            group = [Case((m.name, n, pass_), make_call(layers[m.name], inputs, pass_))
                     for m in methods if not skip_reason(m, cfg, n, pass_)]
            for case in group:
                warm_up(case, cfg.device, cfg.min_sample_s)
            groups.append(group)
        log(f"warmed up n={n}")
    for rep in range(cfg.repeats):
        round_robin(groups, 1, cfg.device, first_round=rep)
        log(f"timing round {rep + 1}/{cfg.repeats} done")
    return {case.key: case for group in groups for case in group}


def layer_rows(cfg: BenchConfig, layers: dict[str, torch.nn.Module], methods: list[Method],
               cases: dict, peaks_gflops: dict[str, float], memory: dict | None) -> list[dict]:
    """One row per (method, n, pass): time (ms), FLOPs, achieved GFLOP/s, fraction of the matmul
    reference of its dtype (``peaks_gflops["fp32"]`` or ``["bf16"]``), peak MiB; a skipped case
    keeps its row, with NaN measurements and the reason in ``status``."""
    peaks = {}
    for row in (memory or {}).get("rows", []):
        peaks[(row["method"], row["n"], row["pass"])] = row["peak_bytes"] / MiB
    rows = []
    for m in methods:
        layer = layers[m.name]
        for n in cfg.seq_lens:
            for pass_ in PASSES:
                key = (m.name, n, pass_)
                flops = layer_flops(m, layer, cfg, n, pass_)
                dtype = "bf16" if m.bf16 else "fp32"
                row = {"method": m.name, "family": m.family, "p": m.p, "rank": m.rank,
                       "features": m.m, "rule": m.rule if m.linear else "softmax",
                       "compiled": m.compiled, "bf16": m.bf16,
                       "backend": attention_backend(m, cfg), "n": n,
                       "pass": pass_, "chunk": layer.chunk_size if m.linear else 0,
                       "gflop": flops / 1e9,
                       **_timing_fields(cases.get(key), flops, peaks_gflops[dtype]),
                       "peak_mib": peaks.get(key, math.nan),
                       "status": skip_reason(m, cfg, n, pass_) or "ok"}
                rows.append(row)
    return rows


def _timing_fields(case: Case | None, flops: float, peak_gflops: float) -> dict:
    """Median/min/max ms, samples, inner loop, GFLOP/s and fraction of the matmul reference."""
    if case is None:
        return {"median_ms": math.nan, "min_ms": math.nan, "max_ms": math.nan, "samples": 0,
                "inner": 0, "gflops": math.nan, "frac_peak": math.nan}
    stats = summary(case.samples)
    gflops = flops / stats["median"] / 1e9
    return {"median_ms": 1e3 * stats["median"], "min_ms": 1e3 * stats["min"],
            "max_ms": 1e3 * stats["max"], "samples": len(case.samples), "inner": case.inner,
            "gflops": gflops, "frac_peak": gflops / peak_gflops}


def machine_info(device: str) -> dict:
    """Device, threads, CPU/GPU name and versions."""
    info = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": cpu_name(), "python": platform.python_version()}
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        ops = fla_backend.fla_ops()
        info["fla"] = f"fla {ops.version}" if ops else fla_backend.unavailable_reason()
    return info


def run_benchmark(cfg: BenchConfig, log: Log = _print, command: str = "") -> dict:
    """Run everything ``cfg`` asks for, write the output files, return the result dict."""
    start = time.perf_counter()
    load_start = _loadavg()
    heap_kept = keep_heap() if torch.device(cfg.device).type == "cpu" else False
    torch.manual_seed(cfg.seed)
    methods = method_list(cfg)
    log(f"device {cfg.device}, {torch.get_num_threads()} threads, methods: "
        f"{', '.join(m.name for m in methods)}")
    matmul = matmul_throughput(cfg.device, cfg.matmul_size, cfg.matmul_repeats, cfg.seed)
    log(f"fp32 matmul {cfg.matmul_size}^2: {matmul['median']:.1f} GFLOP/s "
        f"(min {matmul['min']:.1f}, max {matmul['max']:.1f})")
    matmul_bf16 = None
    if cfg.bf16:
        matmul_bf16 = matmul_throughput(cfg.device, cfg.matmul_size, cfg.matmul_repeats,
                                        cfg.seed, torch.bfloat16)
        log(f"bf16 matmul {cfg.matmul_size}^2: {matmul_bf16['median']:.1f} GFLOP/s "
            f"(native bf16: {native_bf16(cfg.device)})")
    blocks = tune_cp_block_rows(cfg, methods, log)  # tuned in fp32; bf16 twins keep their own
    with cp_block_rows(blocks["chosen"], low_precision=block_rows(torch.bfloat16)):
        chunk = tune_chunk_size(cfg, methods, log)
        layers = {m.name: build_layer(m, cfg, chunk["chosen"]) for m in methods}
        forms = check_forms(cfg, layers, methods, chunk["chosen"])
        compiled = check_twins(cfg, layers, methods, "_compiled")
        bf16_check = check_twins(cfg, layers, methods, "_bf16")
        dtypes = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if cfg.bf16 else {})}
        references = {name: matmul_case(cfg.device, cfg.matmul_size, cfg.seed, dtype, name)
                      for name, dtype in dtypes.items()}
        cases = time_layers(cfg, layers, methods, log, list(references.values()))
        interleaved = {name: case_throughput(case, cfg.matmul_size)
                       for name, case in references.items()}
        peaks = {"fp32": interleaved["fp32"]["median"],
                 "bf16": interleaved["bf16"]["median"] if "bf16" in interleaved else math.nan}
        log("matmul reference interleaved with the layer timings: " + ", ".join(
            f"{name} {r['median']:.1f} GFLOP/s" for name, r in interleaved.items()))
        memory = measure_memory(cfg, chunk["chosen"]) if cfg.memory else None
        if memory:
            log(f"memory measured ({memory['method']})")
        train = measure_training(cfg.train_specs, cfg.device, cfg.train_samples, peaks,
                                 cfg.seed, compiled=bool(cfg.compile),
                                 bf16=bool(cfg.bf16)) if cfg.train else []
    result = {"meta": {**machine_info(cfg.device), "command": command, "heap_kept": heap_kept},
              "config": config_to_dict(cfg), "matmul": matmul, "matmul_bf16": matmul_bf16,
              "matmul_interleaved": interleaved,
              "native_bf16": native_bf16(cfg.device), "chunk": chunk, "cp_blocks": blocks,
              "forms": forms, "compiled_check": compiled, "bf16_check": bf16_check,
              "rows": layer_rows(cfg, layers, methods, cases, peaks, memory),
              "memory": _memory_meta(memory), "train": train}
    result["targets"] = target_checks(result)
    result["meta"].update(wall_s=time.perf_counter() - start, loadavg_start=load_start,
                          loadavg_end=_loadavg())
    write_outputs(result, Path(cfg.out_dir))
    log(f"wrote {cfg.out_dir}/bench.md, bench.csv, train.csv, bench.json, bench.png "
        f"in {result['meta']['wall_s']:.0f} s")
    return result


def _loadavg() -> list[float]:
    """1-, 5- and 15-minute load averages (NaN where the system has none)."""
    try:
        return list(os.getloadavg())
    except OSError:
        return [math.nan] * 3


def _memory_meta(memory: dict | None) -> dict:
    """How memory was measured and the probe's reading (MiB)."""
    if not memory:
        return {"method": "not measured"}
    return {"method": memory["method"], "probe_mib": memory["probe_bytes"] / MiB,
            "probe_expected_mib": memory["probe_expected"] / MiB}
