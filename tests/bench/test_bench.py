"""Smoke run of ``arbench.bench`` in-process (tiny sizes, one repeat) and its FLOP formulas."""

import csv
import math
from itertools import product

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from arbench.bench import run_benchmark, smoke_config
from arbench.bench.flops import linear_layer_flops
from arbench.bench.layers import (
    PASSES,
    build_layer,
    forms_disagreement,
    make_inputs,
    method_list,
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cfg = smoke_config(out_dir=str(out), device="cpu")
    return cfg, run_benchmark(cfg, log=lambda msg: None), out


def test_every_method_ran_on_cpu(smoke):
    cfg, result, _ = smoke
    assert result["meta"]["device"] == "cpu"
    names = {m.name for m in method_list(cfg)}
    assert {"softmax", "based_r4", "flatten_p4", "polysketch_p4"} <= names
    assert {f"llops_p{p}_t{t}" for p in (2, 4, 6) for t in (1, 4)} <= names
    for row in result["rows"]:
        assert row["status"] == "ok", row
        assert row["median_ms"] > 0 and math.isfinite(row["gflops"]), row
        assert row["peak_mib"] >= 0, row
    assert {r["method"] for r in result["rows"]} == names


def test_csv_has_every_method_n_pass(smoke):
    cfg, result, out = smoke
    with open(out / "bench.csv") as fh:
        rows = list(csv.DictReader(fh))
    keys = {(r["method"], int(r["n"]), r["pass"]) for r in rows}
    expected = set(product([m.name for m in method_list(cfg)], cfg.seq_lens, PASSES))
    assert keys == expected and len(rows) == len(expected)
    for name in ("bench.md", "bench.png", "bench.json", "train.csv"):
        assert (out / name).stat().st_size > 0
    text = (out / "bench.md").read_text()
    assert "## Target checks" in text
    assert len(result["targets"]["checks"]) >= 6
    assert {c["verdict"] for c in result["targets"]["checks"]} <= {"PASS", "MISS", "n/a"}


def test_chunk_size_tuned_on_both_feature_widths(smoke):
    cfg, result, out = smoke
    chunk = result["chunk"]
    assert chunk["methods"] == ["llops_p4_t1", f"based_r{cfg.based_r}"]
    assert {(r["method"], r["chunk"]) for r in chunk["table"]} == set(
        product(chunk["methods"], cfg.chunk_sizes))
    totals = {c: sum(r["fwd_bwd_ms"] for r in chunk["table"] if r["chunk"] == c)
              for c in cfg.chunk_sizes}
    assert chunk["chosen"] == min(totals, key=totals.get)
    assert f"chunk size used: **{chunk['chosen']}**" in (out / "bench.md").read_text()


def test_cp_block_rows_tuned_and_restored(smoke):
    from arbench.kernels.cp import DEFAULT_BLOCK_ROWS, block_rows

    cfg, result, out = smoke
    blocks = result["cp_blocks"]
    assert blocks["methods"] == ["llops_p4_t1", "llops_p6_t4"]
    assert {(r["method"], r["rows"]) for r in blocks["table"]} == set(
        product(blocks["methods"], cfg.cp_block_rows))
    assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in blocks["table"])
    assert blocks["chosen"] in cfg.cp_block_rows
    assert f"rows per block (0 = one block): **{blocks['chosen']}**" in (out / "bench.md").read_text()
    assert block_rows() == DEFAULT_BLOCK_ROWS  # the run's choice does not leak out of it


def test_training_rows(smoke):
    _, result, _ = smoke
    keys = {(r["spec"], r["head"]) for r in result["train"]}
    assert keys == {(s, h) for s in ("p4", "cpu", "long") for h in ("answer", "full")}
    assert all(r["tokens_per_s"] > 0 and r["gflop_per_step"] > 0 for r in result["train"])


def test_memory_probe_reads_its_size(smoke):
    _, result, _ = smoke
    mem = result["memory"]
    assert mem["probe_mib"] == pytest.approx(mem["probe_expected_mib"], rel=0.1)


def test_chunked_and_quadratic_forms_agree(smoke):
    cfg, result, _ = smoke
    additive = [m for m in method_list(cfg) if m.linear and not m.derived]
    assert len(result["forms"]) == len(additive)
    assert all(r["rel_err"] < 1e-5 for r in result["forms"]), result["forms"]
    # and with n not a multiple of the chunk, full layer outputs (after the division)
    inputs = make_inputs(cfg, 37)
    for method in additive:
        layer = build_layer(method, cfg, chunk_size=16)
        assert forms_disagreement(layer, inputs) < 1e-5
        with torch.no_grad():
            chunked = layer(inputs.q, inputs.k, inputs.v)
            layer.mode = "quadratic"
            quadratic = layer(inputs.q, inputs.k, inputs.v)
        assert torch.isfinite(chunked).all()
        torch.testing.assert_close(chunked, quadratic, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name,slack", [
    ("llops_p4_t1", 1.05), ("llops_p2_t4", 1.05), ("flatten_p4", 1.05), ("based_r4", 1.05),
    ("gated_llops_p2_t1", 1.05),
    # the delta rule adds the c³ triangular solves, which the counter does not see
    ("delta_llops_p2_t1", 1.1), ("gated_delta_llops_p2_t1", 1.1)])
def test_flop_formula_matches_torch_counter(name, slack):
    """Matmul FLOPs seen by ``FlopCounterMode`` ≈ our count (which adds the few elementwise ops)."""
    cfg = smoke_config(head_dim=64, m=32, based_r=8)
    method = next(m for m in method_list(cfg) if m.name.startswith(name.split("_r")[0]))
    layer = build_layer(method, cfg, chunk_size=64)
    inputs = make_inputs(cfg, 256)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(inputs.q, inputs.k, inputs.v)
    ours = linear_layer_flops(layer.phi_q, layer.phi_k, 256, cfg.head_dim, 64,
                              layer.normalize != "none", 1, layer.rule)
    assert counter.get_total_flops() <= ours <= slack * counter.get_total_flops()


@pytest.mark.parametrize("name", ["llops_p4_t1", "llops_p2_t4", "polysketch_p4", "based_r8",
                                  "flatten_p4"])
def test_forward_backward_count_matches_torch_counter(name):
    """Forward+backward on the reference forms (plain autograd, every product visible to the
    counter): 3× the state update and each trainable map, 2× a map with fixed weights
    (PolySketch's sketch gets no gradient; counted 3×, it would read 1.28× here)."""
    from arbench.bench.layers import layer_flops
    from arbench.precision import cpu_kernels

    cfg = smoke_config(head_dim=64, m=32, based_r=8)
    method = next(m for m in method_list(cfg) if m.name == name)
    layer = build_layer(method, cfg, chunk_size=64)
    inputs = make_inputs(cfg, 256)
    with FlopCounterMode(display=False) as counter, cpu_kernels(False):
        layer(inputs.qg, inputs.kg, inputs.vg).backward(inputs.dy)
    ours = layer_flops(method, layer, cfg, 256, "fwd_bwd")
    assert counter.get_total_flops() <= ours <= 1.02 * counter.get_total_flops()


def test_rows_fla_computes_are_counted_at_flas_chunk(monkeypatch):
    from arbench.bench import layers
    from arbench.kernels.fla_backend import FLA_CHUNK

    cfg = smoke_config(head_dim=64, m=32)
    method = next(m for m in method_list(cfg) if m.name == "llops_p4_t1")
    layer = build_layer(method, cfg, chunk_size=128)
    own = layers.layer_flops(method, layer, cfg, 1024, "fwd")
    monkeypatch.setattr(layers, "attention_backend", lambda method, cfg: "fla 0.0")
    fla = layers.layer_flops(method, layer, cfg, 1024, "fwd")
    assert own == linear_layer_flops(layer.phi_q, layer.phi_k, 1024, 64, 128, False, 1)
    assert fla == linear_layer_flops(layer.phi_q, layer.phi_k, 1024, 64, FLA_CHUNK, False, 1)
    assert fla < own


def test_the_bf16_layer_check_reads_additive_state_only():
    """The gated and delta rules keep their state in fp32 under autocast: their bf16 twins'
    share of the bf16 reference is no verdict on the bf16 kernels."""
    from arbench.bench.targets import bf16_checks

    def row(rule, frac):
        return {"bf16": True, "family": "llops", "rule": rule, "n": 4096, "pass": "fwd",
                "status": "ok", "frac_peak": frac, "method": f"{rule}_llops", "gflops": 1.0}

    result = {"matmul_bf16": {"median": 1.0}, "native_bf16": True, "train": [],
              "rows": [row("linear", 0.7), row("delta", 0.2)]}
    (fwd,) = [c for c in bf16_checks(result) if "forward at n = 4096" in c["target"]]
    assert "linear_llops" in fwd["measured"] and fwd["verdict"] == "PASS"


def test_compile_option_adds_compiled_twins_of_linear_methods():
    cfg = smoke_config(methods=("llops_p4_t1", "based_r4", "softmax"), compile=("llops_p4_t1",))
    methods = {m.name: m for m in method_list(cfg)}
    assert set(methods) == {"llops_p4_t1", "based_r4", "softmax", "llops_p4_t1_compiled"}
    twin = methods["llops_p4_t1_compiled"]
    assert twin.compiled and (twin.family, twin.p, twin.rank) == ("llops", 4, 1)
    every = method_list(smoke_config(methods=("based_r4", "softmax"), compile=("all",)))
    assert [m.name for m in every if m.compiled] == ["based_r4_compiled"]
    with pytest.raises(ValueError, match="cannot compile \\['softmax'\\]"):
        method_list(smoke_config(compile=("softmax",)))


def test_profile_groups_operators_and_counts_matmul_flops():
    from arbench.bench.profile import category, profile_case

    assert [category(n) for n in ("aten::mm", "aten::mul_", "aten::cat", "aten::embedding")] == \
        ["matmul", "elementwise", "memory", "other"]
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    result = profile_case(lambda: torch.cat([(a @ b) * 2.0, a @ b], dim=0), calls=3)
    cats = result["by_category_ms"]
    assert cats["matmul"] > 0 and cats["elementwise"] > 0 and cats["memory"] > 0
    assert sum(cats.values()) == pytest.approx(result["total_ms"])
    assert result["matmul_gflop"] == pytest.approx(2 * 2 * 64 * 32 * 48 / 1e9)
    acc = torch.zeros(64, 48)
    result = profile_case(lambda: acc.addmm_(a, b), calls=2)  # the profiler does not count it
    assert result["matmul_gflop"] == pytest.approx(2 * 64 * 32 * 48 / 1e9)


@pytest.mark.parametrize("argv,message", [
    (["--cp-block-rows", "0", "-1"], "error: --cp-block-rows must be >= 0, got -1"),
    (["--chunk-sizes", "0"], "error: --chunk-sizes must be >= 1, got 0"),
    (["--seq-lens", "64", "-8"], "error: --seq-lens must be >= 1, got -8"),
    (["--min-sample-s", "-0.5"], "error: --min-sample-s must be >= 0, got -0.5"),
    (["--device", "gpu"], "error: --device gpu: not a torch device (e.g. cpu, cuda, cuda:0)"),
])
def test_bench_cli_bad_sizes_one_line(capsys, argv, message):
    from arbench.bench.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--smoke", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_profile_cli_bad_sizes_one_line(capsys):
    from arbench.bench.profile import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--chunk", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --chunk must be >= 1, got 0"]


def test_profile_cases_per_dtype():
    from arbench.bench.profile import cases

    # built, not run: a training step per size and the four layers twice, in one dtype
    for bf16, head, suffix in ((False, "answer", ""), (True, "answer_bf16", "_bf16")):
        names = list(cases(steps=1, n=64, chunk=16, bf16=bf16))
        assert names[:3] == [f"{size} training step ({head} head)" for size in ("p4", "cpu", "long")]
        layers = [n.split(" layer ")[0] for n in names[3:]]
        assert layers == [m + suffix for m in ("llops_p4_t1", "llops_p6_t4", "based_r16",
                                               "flatten_p4") for _ in range(2)]


def test_bf16_twins_with_their_own_matmul_reference(tmp_path):
    cfg = smoke_config(methods=("llops_p2_t1", "softmax"), bf16=("all",), memory=False,
                       out_dir=str(tmp_path))
    assert [m.name for m in method_list(cfg) if m.bf16] == ["llops_p2_t1_bf16", "softmax_bf16"]
    with pytest.raises(ValueError, match="no method \\['nosuch'\\] to run in bf16"):
        method_list(smoke_config(bf16=("nosuch",)))
    result = run_benchmark(cfg, log=lambda msg: None)
    mm = result["matmul_bf16"]
    assert mm["median"] > 0 and isinstance(result["native_bf16"], bool)
    twin = [r for r in result["rows"] if r["method"] == "llops_p2_t1_bf16"]
    assert twin and all(r["bf16"] and r["status"] == "ok" for r in twin)
    # every row is read against its dtype's matmul reference as timed in the same rounds
    refs = result["matmul_interleaved"]
    assert set(refs) == {"fp32", "bf16"}
    assert all(r["samples"] == cfg.repeats and r["median"] > 0 for r in refs.values())
    for r in twin:
        assert r["frac_peak"] == pytest.approx(r["gflops"] / refs["bf16"]["median"])
    fp32_row = next(r for r in result["rows"] if r["method"] == "llops_p2_t1")
    assert fp32_row["frac_peak"] == pytest.approx(fp32_row["gflops"] / refs["fp32"]["median"])
    assert result["bf16_check"][0]["rel_err"] < 0.05  # bf16 vs fp32 forward, same weights
    heads = {(r["spec"], r["head"]) for r in result["train"]}
    assert {(size, head) for size in ("cpu", "p4", "long")
            for head in ("answer_bf16", "answer_bf16_conv_fp32")} <= heads
    checks = {c["target"]: c for c in result["targets"]["checks"]}
    for target in ("training step at the cpu size in bf16: ≥ 2.0× the fp32 tokens/s",
                   "training step at the long size in bf16: ≥ 1.8× the fp32 tokens/s",
                   "training step at the cpu size in bf16 with the conv layer in fp32: ≥ 2.0× "
                   "the fp32 tokens/s"):
        assert checks[target]["measured"].endswith("tokens/s)")
    assert "LLoPS layer forward+backward at n = 4096 in bf16: ≥ 40% of bf16 matmul FLOP/s" in checks
    md = (tmp_path / "bench.md").read_text()
    assert "bf16 matmul reference" in md and "## bf16 autocast" in md
    assert "timed once in every round of the layer timings" in md


def test_bf16_conv_fp32_head_keeps_the_conv_layer_in_fp32():
    from arbench.bench.config import CPU_TRAIN
    from arbench.bench.training import BF16_HEADS, build_model

    model = build_model(CPU_TRAIN, "cpu", fp32_mixers=BF16_HEADS["answer_bf16_conv_fp32"][1])
    assert [b.fp32_mixer for b in model.blocks] == [True, False]
