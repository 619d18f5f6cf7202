"""The prepared GPU check (scripts/device_check.sh, arbench.bench.device_check) on a CPU: the
dry run (arguments, test selection, bench and fit command lines, output layout), the step
runner's limits, the one-line errors, and the summary from real CPU outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arbench.bench import run_benchmark, smoke_config
from arbench.bench.device_check import (
    BUDGET_S,
    CLAIM_METHODS,
    REST_METHODS,
    STEP_LIMITS_S,
    Command,
    Step,
    main,
    remove_checkpoints,
    run_step,
    slug,
)
from arbench.bench.device_report import (
    bench_rows,
    fit_results,
    junit_counts,
    rows_of,
    summary_markdown,
)
from arbench.bench.layers import attention_backend, method_list
from arbench.bench.targets import based_ratios

ROOT = Path(__file__).resolve().parents[2]


def test_step_limits_fit_the_budget():
    assert BUDGET_S <= 8 * 60
    assert sum(STEP_LIMITS_S.values()) <= BUDGET_S - 20  # the device query and the summary


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "check"
    proc = subprocess.run([str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--out",
                           str(out)], capture_output=True, text=True, cwd=ROOT, check=False)
    return proc, out


def test_dry_run_checks_every_step(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "device.json").read_text())
    assert record["dry_run"] and record["device"].startswith("dry-run")
    steps = {s["name"]: s for s in record["steps"]}
    assert list(steps) == ["tests", "bench_fp32", "bench_bf16", "bench_rest", "fit"]
    assert all(s["status"] == "ok" for s in steps.values()), steps
    for name, methods, bf16 in (("bench_fp32", CLAIM_METHODS, False),
                                ("bench_bf16", CLAIM_METHODS, True),
                                ("bench_rest", REST_METHODS, True)):
        want = [*methods, *(f"{m}_bf16" for m in methods if bf16)]
        assert sorted(steps[name]["methods"]) == sorted(want)
        argv = steps[name]["would_run"][0]["argv"]
        assert argv[argv.index("--device") + 1] == "cuda"
        assert argv[argv.index("--out") + 1].startswith(str(out / "bench"))
    collected = (out / "tests.log").read_text()
    assert "test_cuda_fla_path_matches_arbench_reference" in collected
    assert "test_compiled_equals_reference_on_cpu" not in collected  # -k cuda: CPU tests stay
    for name in ("based", "p4"):
        config = (out / "fit" / f"{name}.config.yaml").read_text()
        assert "max_time: 00:00:01:00" in config and "precision: bf16-mixed" in config
        assert f"save_dir: {out / 'fit'}" in config
    assert (out / "bench").is_dir()
    summary = (out / "summary.md").read_text()
    assert "**Dry run**" in summary and "| bench_bf16 | ok |" in summary


def test_without_cuda_the_check_stops_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no CUDA device here") and "\n" not in err


def test_unwritable_out_stops_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--dry-run", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out") and "\n" not in err
    assert not (blocker.parent / "sub").exists()


def test_slug_names_a_folder():
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("  ") == "unknown"


def test_run_step_kills_at_the_limit_and_reports_failures(tmp_path):
    sleeper = Command((sys.executable, "-c", "import time; time.sleep(60)"), "slow.log")
    failing = Command((sys.executable, "-c", "print('out'); raise SystemExit(3)"), "fail.log")
    done = run_step(Step("both", (sleeper, failing), limit_s=2), tmp_path)
    assert done["status"] == "timed out" and done["wall_s"] < 20
    assert run_step(Step("fail", (failing,), 30), tmp_path)["status"] == "failed (exit [3])"
    assert (tmp_path / "fail.log").read_text().strip() == "out"


@pytest.fixture(scope="module")
def cpu_bench(tmp_path_factory):
    """A real (smoke, CPU) bench run in the check's layout, fp32 and bf16 twins."""
    out = tmp_path_factory.mktemp("check")
    cfg = smoke_config(out_dir=str(out / "bench" / "bf16"), device="cpu", memory=False,
                       train=False, methods=("llops_p2_t1", "llops_p4_t1", "based_r4",
                                             "softmax"), bf16=("all",))
    return out, cfg, run_benchmark(cfg, log=lambda msg: None)


def test_summary_reports_the_claim_from_bench_json(cpu_bench):
    out, cfg, result = cpu_bench
    rows = bench_rows(out)
    assert len(rows) == len(result["rows"])
    twice = out / "bench" / "fp32"  # a second run measuring the same rows: each counted once
    twice.mkdir(exist_ok=True)
    (twice / "bench.json").write_text((out / "bench" / "bf16" / "bench.json").read_text())
    assert bench_rows(out) == rows
    assert {r["backend"] for r in rows} == {"arbench", "sdpa"}  # on a CPU nothing goes to fla
    for m in method_list(cfg):
        assert attention_backend(m, cfg) == ("sdpa" if m.family == "softmax" else "arbench")
    text = summary_markdown(out, {"device": "cpu test", "steps": []})
    for dtype in ("fp32", "bf16"):
        ratios = based_ratios([r for r in rows_of(rows, dtype)])
        assert ratios, dtype
        for r in ratios:
            assert f"{r['time_ratio']:.2f} ({r['flop_ratio']:.1f})" in text
    assert "| llops_p4_t1 | arbench |" in text
    assert text.count("| based_r4 | ") >= 2  # a crossover row per dtype
    assert "## CUDA tests\n\nnot run" in text and "no run summary written" in text


def test_junit_counts_of_a_real_pytest_run(tmp_path):
    xml = tmp_path / "tests.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "tests/kernels/test_fla_backend.py", "-k", "layout or cuda_fla_kernels",
                    f"--junitxml={xml}"], cwd=ROOT, capture_output=True, check=False)
    counts = junit_counts(xml)
    assert counts["tests"] == 1 + 8 and counts["failures"] == counts["errors"] == 0
    assert counts["skipped"] == 8 if not torch.cuda.is_available() else counts["skipped"] in (0, 8)
    assert junit_counts(tmp_path / "absent.xml") is None


def test_fit_results_and_checkpoints_of_a_real_smoke_fit(tmp_path):
    fit = tmp_path / "fit"
    proc = subprocess.run([sys.executable, "main.py", "fit", "--config", "configs/p4.yaml",
                           "--config", "configs/profiles/smoke.yaml", "--config",
                           "configs/sizes/tiny.yaml", "--trainer.logger.init_args.save_dir",
                           str(fit)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary,) = fit.glob("p4/version_*/summary.json")
    written = json.loads(summary.read_text())
    (got,) = fit_results(fit)
    assert got["run"] == "p4" and got["val_acc"] == written["val_acc"]
    assert got["global_step"] == written["global_step"] > 0
    assert remove_checkpoints(fit) > 0 and not list(fit.rglob("*.ckpt"))
    assert f"| p4 | {written['val_acc']:.4f} |" in summary_markdown(tmp_path, {"steps": []})
