import csv
from pathlib import Path

import pytest
import torch
from approx_helpers import fake_lit, tiny_model
from hostile import hostile_checkpoint

import arbench.approx.cli as cli
from arbench.approx.cli import main
from arbench.approx.extract import extract_from_teacher
from arbench.approx.qkset import save_qk
from arbench.approx.records import EXPLICIT, FITTED_OPTIMAL, FLOOR
from arbench.machine import device_name

TINY = ["--p", "2", "3", "--m", "8", "--ranks", "1", "2", "--steps", "15", "--lr", "1e-2",
        "--n-train", "64", "--n-test", "32", "--num-seqs", "4", "--seq-len", "32",
        "--als-sweeps", "5", "--polish-steps", "20"]


def table_rows(path):
    return [line for line in path.read_text().splitlines() if line.startswith("| ")]


def test_synthetic_run_writes_every_row(tmp_path, capsys):
    out = tmp_path / "approx"
    assert main(["--synthetic", "--layers", "0", "2", "--head-dim", "4", "--out", str(out),
                 *TINY]) == 0
    printed = capsys.readouterr().out
    assert "[L2 h0 p=3] LLoPS t=2" in printed and "held-out RMAE" in printed
    text = (out / "table.md").read_text()
    assert "RMAE = Σ|Â − A| / Σ|A|" in text
    methods = ["Eckart–Young floor", "Thm 3.1 W* (held-out)", "Thm 3.1 W* (train)",
               "PolySketchFormer", "2-layer MLP", "Flatten", "BASED-style", "LLoPS t=1",
               "LLoPS t=2"]
    rows = table_rows(out / "table.md")
    for p in (2, 3):
        for method in methods:
            # each row appears in both tables (RMAE and relative Frobenius)
            assert sum(r.startswith(f"| {p} | ") and method in r for r in rows) == 2, (p, method)
    assert "| p | method | m' | L0 | L2 | mean | ÷ data limit | paper mean |" in text
    assert "0.022" in text and "0.741" in text  # the paper's means sit beside ours
    with (out / "table.csv").open() as fh:
        records = list(csv.DictReader(fh))
    assert len(records) == 2 * 2 * len(methods)  # p x layers x rows
    assert (out / "error_vs_rank.png").stat().st_size > 0
    # every row names the machine that computed it, and table.md says where the rows came from
    assert {row["machine"] for row in records} == {device_name("cpu")}
    maps = [r for r in records if r["method"] not in (FLOOR, EXPLICIT, FITTED_OPTIMAL)]
    assert (f"- maps (cells of layer × p × map) computed on: {device_name('cpu')} ({len(maps)}); "
            f"floor and data-limit cells on: {device_name('cpu')} ({len(records) - len(maps)}) "
            "(each cell's machine: table.csv)") in text
    starts = {"2-layer MLP": "adam", "Flatten": "adam", "BASED-style": "svd", "LLoPS t=1": "als"}
    for row in records:
        if row["method"] in starts:  # every fit: its start, steps, stop and gradient norm
            assert row["fit_start"].startswith(starts[row["method"]]), row
            assert row["fit_stop"] in ("stationary", "stalled", "max steps"), row
            assert 0 < int(row["polish_steps"]) <= 20 and float(row["grad_norm"]) >= 0, row
        if row["method"] == "PolySketchFormer":
            assert row["fit_start"] == row["grad_norm"] == "", row


def test_validation_sequences_stop_every_fit_and_the_table_says_so(tmp_path):
    out = tmp_path / "approx"
    assert main(["--synthetic", "--layers", "0", "--head-dim", "4", "--out", str(out),
                 "--train-seqs", "4", "--val-seqs", "2", *TINY]) == 0
    text = (out / "table.md").read_text()
    assert "Validation (--val-seqs 2): all tokens of the last 2" in text
    assert "and 2 training-only ones (of 4, less the --val-seqs ones)" in text
    with (out / "table.csv").open() as fh:
        fitted = [row for row in csv.DictReader(fh) if row["fit_stop"]]
    assert {row["method"] for row in fitted} == {"2-layer MLP", "Flatten", "BASED-style",
                                                 "LLoPS t=1", "LLoPS t=2"}
    kept = ", step of least validation loss kept"  # a stop for another reason, an earlier step
    for row in fitted:
        assert row["fit_stop"].removesuffix(kept) in ("stationary", "stalled", "max steps",
                                                      "validation"), row


def test_teacher_and_saved_extraction(tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "teacher.ckpt"
    torch.save({"state_dict": {}}, ckpt)  # read tensors only before the (fake) Lightning
    model = tiny_model(["softmax"], n_layers=3, num_heads=2)
    fake_lit(monkeypatch, {str(ckpt): model})
    saved = tmp_path / "qk.pt"
    assert main(["--teacher", str(ckpt), "--layers", "0", "2", "--heads", "1",
                 "--num-kv-pairs", "2", "--methods", "polysketch", "llops", "--save-qk",
                 str(saved), "--out", str(tmp_path / "a"), *TINY]) == 0
    assert "| L0 | L2 |" in (tmp_path / "a" / "table.md").read_text()
    assert main(["--qk", str(saved), "--layers", "2", "--methods", "llops", "--out",
                 str(tmp_path / "b"), *TINY]) == 0
    assert "| L2 | mean |" in (tmp_path / "b" / "table.md").read_text()


@pytest.mark.parametrize("args,message", [
    (["--synthetic", "--p", "0"], "error: p must be an integer >= 1, got 0"),
    (["--synthetic", "--m", "500", "--n-test", "100"],
     "error: m=500 is larger than the number of held-out queries/keys (100)"),
    (["--teacher", "{ckpt}", "--layers", "7"], "error: layer index 7 is out of range"),
    (["--teacher", "{linear}"], "is not a softmax teacher: its mixers are ['conv', 'linear']"),
    (["--teacher", "{tmp}/missing.ckpt"], "does not exist"),
    (["--qk", "{tmp}/missing.pt"], "does not exist"),
    (["--synthetic", "--train-seqs", "-1"], "error: --train-seqs must be an integer >= 0, got -1"),
    (["--synthetic", "--polish-steps", "-1"], "error: L-BFGS steps must be >= 0"),
    (["--synthetic", "--gtol", "-1"], "error: L-BFGS steps must be >= 0, gtol >= 0"),
    (["--synthetic", "--als-sweeps", "-2"], "error: ALS sweeps must be >= 0"),
    (["--synthetic", "--train-seqs", "3", "--val-seqs", "4"],
     "error: --val-seqs 4 needs as many training-only sequences (--train-seqs), got 3"),
    (["--synthetic", "--val-seqs", "-1"], "error: --val-seqs must be an integer >= 0, got -1"),
    (["--teacher", "{evil}"], "evil.ckpt refused: it holds an object other than tensors"),
])
def test_bad_input_gives_one_line(args, message, tmp_path, monkeypatch, capsys):
    ckpt, linear = tmp_path / "t.ckpt", tmp_path / "l.ckpt"
    for path in (ckpt, linear):
        torch.save({"state_dict": {}}, path)
    evil = hostile_checkpoint(tmp_path / "evil.ckpt", tmp_path / "MARKER")
    fake_lit(monkeypatch, {str(ckpt): tiny_model(["softmax"], n_layers=2),
                           str(linear): tiny_model(["conv", "linear"], n_layers=2)})
    args = [a.format(ckpt=ckpt, linear=linear, tmp=tmp_path, evil=evil) for a in args]
    assert main([*args, "--out", str(tmp_path / "o"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "MARKER").exists()  # the hostile teacher's code never ran


def test_saved_extraction_needs_existing_layer(tmp_path, capsys):
    qk = extract_from_teacher(tiny_model(["softmax"], n_layers=2), [0], [0], num_seqs=2,
                              seq_len=16, num_kv_pairs=2)
    path = save_qk(qk, tmp_path / "qk.pt")
    assert main(["--qk", str(path), "--layers", "1", "--out", str(tmp_path / "o")]) == 2
    assert "error: layer 1 is not in the saved extraction" in capsys.readouterr().err


def test_refuses_a_folder_of_tables_without_records(tmp_path, monkeypatch, capsys):
    """Tables but no records.jsonl (another run's, an older version's): refused before any
    extraction or fit, the tables untouched; records beside them, or no tables, pass."""

    def no_fit(cfg):
        raise AssertionError("loaded queries/keys before refusing the folder")

    monkeypatch.setattr(cli, "load_source", no_fit)
    out = tmp_path / "old"
    out.mkdir()
    (out / "table.md").write_text("committed\n")
    assert main(["--synthetic", "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out {out} holds table.md but no records.jsonl: written by another "
                   "run or an older version; give another --out\n")
    assert (out / "table.md").read_text() == "committed\n"
    (out / "records.jsonl").write_text("")
    cli.check_own_folder(out)  # a folder of this study's records is resumed
    cli.check_own_folder(tmp_path / "new")


def test_default_out_keeps_the_committed_tables(monkeypatch, capsys):
    """The default --out is the committed results/approx (its teacher, tables, no records):
    a run without --out is refused there in one line."""

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert Path("results/approx/table.md").exists()
    monkeypatch.setattr(cli, "load_source", lambda cfg: pytest.fail("would fit and write"))
    assert main(["--synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out results/approx holds table.md and table.csv but no "
                          "records.jsonl") and err.count("\n") == 1
