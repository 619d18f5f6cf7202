"""A feature map defined outside arbench, named by an ordinary method config, works unchanged in
``main.py fit``, ``python -m arbench.bench --method-config`` and
``python -m arbench.approx --method-config``; and the registry reads the shipped configs."""

import math
import textwrap

import pytest
from paths import SMOKE, config

from arbench.approx.cli import main as approx_main
from arbench.bench.__main__ import main as bench_main
from arbench.bench.config import smoke_config
from arbench.bench.layers import method_list
from arbench.cli import run
from arbench.featuremaps import LLoPS
from arbench.registry import FEATURE_MAPS, check_init_args, feature_map_class, load_method_config

OUTSIDE = '''
import torch
from arbench.featuremaps import FeatureMap


class CosineMap(FeatureMap):
    """phi(x) = [cos(x W), sin(x W)] / sqrt(m) with a learned W (head_dim, m)."""

    def __init__(self, head_dim: int, m: int = 8):
        super().__init__()
        self.head_dim, self.feature_dim = head_dim, 2 * m
        self.w = torch.nn.Parameter(torch.randn(head_dim, m) / head_dim ** 0.5)

    def forward(self, x):
        y = x @ self.w
        return torch.cat([y.cos(), y.sin()], dim=-1) / self.w.shape[1] ** 0.5
'''

METHOD = """
model:
  mixers: [conv, linear]
  feature_map:
    class_path: outside_maps.CosineMap
    init_args: {m: 6}
trainer:
  logger:
    init_args: {name: cosine}
"""


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """``outside_maps.CosineMap`` in a folder on sys.path, and a method config naming it."""
    (tmp_path / "outside_maps.py").write_text(textwrap.dedent(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "cosine.yaml"
    path.write_text(METHOD)
    return str(path)


def test_outside_map_trains_in_fit(outside, in_tmp):
    cli = run(["fit", "--config", outside, *SMOKE, "--trainer.max_steps", "4",
               "--trainer.val_check_interval", "4", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.global_step == 4
    assert type(cli.model.model.blocks[1].mixer.phi_q).__name__ == "CosineMap"
    assert cli.model.hparams_for_logging()["feature_map"] == "CosineMap"
    assert math.isfinite(float(cli.trainer.callback_metrics["val/acc"]))


def test_outside_map_in_the_bench(outside, tmp_path):
    out = tmp_path / "bench"
    result = bench_main(["--smoke", "--method-config", outside, "--methods", "softmax",
                   "--no-train", "--seq-lens", "64", "--out", str(out)])
    rows = [r for r in result["rows"] if r["method"] == "cosine"]
    assert {r["pass"] for r in rows} == {"fwd", "fwd_bwd"}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 and r["family"] == "custom"
               and r["features"] == 12 for r in rows)
    # FLOPs: the map's matmuls as torch's counter sees them (2·d·m per token and map) plus
    # the attention's; memory measured in the worker process, which imports the map too
    head_dim = 16  # the smoke size
    maps = 2 * 64 * (2 * head_dim * 6)
    assert all(r["gflop"] * 1e9 > maps for r in rows)
    assert all(r["peak_mib"] >= 0 for r in rows)
    assert [r["method"] for r in result["forms"]] == ["cosine"]
    assert result["forms"][0]["rel_err"] < 1e-5
    assert "| cosine |" in (out / "bench.md").read_text()


def test_outside_map_in_the_approximation_study(outside, tmp_path, capsys):
    out = tmp_path / "approx"
    assert approx_main(["--synthetic", "--method-config", outside, "--method-config",
                 config("p4.yaml"), "--methods", "polysketch", "--layers", "0", "--head-dim",
                 "4", "--p", "2", "--m", "8", "--steps", "10", "--n-train", "64",
                 "--n-test", "32", "--num-seqs", "4", "--seq-len", "32", "--out",
                 str(out)]) == 0
    text = (out / "table.md").read_text()
    assert "| 2 | cosine (CosineMap) | 12 |" in text
    assert "| 2 | p4 (LLoPS) | 256 |" in text
    assert "PolySketchFormer" in text and "LLoPS t=1" not in text
    assert "[L0 h0 p=2] cosine (CosineMap): adam" in capsys.readouterr().out  # fitted


def test_registry_reads_the_shipped_method_configs():
    p4 = load_method_config(config("p4.yaml"))
    assert (p4.name, p4.class_path, p4.kwargs) == ("p4", "arbench.featuremaps.LLoPS",
                                                   {"m": 256, "p": 4, "rank": 1})
    fm = p4.build(128)
    assert isinstance(fm, LLoPS) and (fm.p, fm.m) == (4, 256)
    assert feature_map_class("based") is FEATURE_MAPS["based"]
    assert feature_map_class("LLoPS") is LLoPS
    with pytest.raises(ValueError, match="has no model.feature_map block"):
        load_method_config(config("softmax.yaml"))
    with pytest.raises(ValueError, match="is not a FeatureMap subclass"):
        feature_map_class("torch.nn.Linear")
    with pytest.raises(ValueError, match="cannot import feature map 'nosuch.Map'"):
        feature_map_class("nosuch.Map")


def test_method_config_names_must_not_clash(tmp_path):
    clash = tmp_path / "clash.yaml"
    clash.write_text("model:\n  feature_map:\n    class_path: arbench.featuremaps.Identity\n"
                     "trainer:\n  logger:\n    init_args: {name: softmax}\n")
    with pytest.raises(ValueError, match="method name 'softmax' is taken"):
        method_list(smoke_config(method_configs=(str(clash),)))
    names = [m.name for m in method_list(smoke_config(method_configs=(config("p4.yaml"),)))]
    assert names == ["p4"]


@pytest.mark.parametrize("command", ["bench", "approx"])
def test_unknown_init_arg_is_one_line_before_any_work(command, tmp_path, capsys):
    """A mistyped init arg names the file, the class and the key, before a fit or a timing."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  feature_map:\n    class_path: arbench.featuremaps.LLoPS\n"
                   "    init_args: {m: 16, p: 2, bogus: 1, zz: 2}\n")
    out = str(tmp_path / "out")
    if command == "bench":
        with pytest.raises(SystemExit) as stop:
            bench_main(["--smoke", "--method-config", str(bad), "--out", out])
        assert stop.value.code == 2
    else:
        assert approx_main(["--synthetic", "--method-config", str(bad), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: method config {bad}: model.feature_map.init_args: LLoPS has "
                          "no init arg(s) bogus, zz (it takes ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="has no init arg"):
        check_init_args(LLoPS, {"m": 4, "nope": 1}, "x")
    check_init_args(LLoPS, {"m": 4, "p": 2}, "x")
